"""Patch points as data, and the transaction that applies them.

A :class:`PatchPoint` names one attribute of torch (a module global, or an
attribute in a class ``__dict__``), how to build its replacement from the
original, which torch versions and modes it is for, why it exists, and which
other modules did ``from <module> import <name>`` and so hold their own
reference that must be rebound too.

:func:`apply` resolves and builds *every* replacement before it touches
anything, then sets them one by one while journaling what it replaced; any
failure (while building, setting or self-checking) rolls the journal back, so
torch is either fully patched or untouched. :func:`revert` puts back the very
objects that were there before (``is``-identical), or deletes attributes that
did not exist.
"""

from __future__ import annotations

import importlib
import re
import sys
import threading
from types import ModuleType
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._modes import POINT_MODES, Mode
from . import dynamo_rules

_MISSING = object()

#: a ``PatchPoint.series`` entry: "0001 torch/path/file.py::qualname"
SERIES_ENTRY = re.compile(r"^\d{4} torch/\S+\.py::\S+$")

#: Modes a point can belong to. BACKPORT: torch lacks the feature;
#: FORCED: torch has it natively and we replace its runtime with ours;
#: NATIVE_FIXES: torch has it natively but lacks later upstream fixes,
#: which are applied as points (``upstream_fix`` names the PR).
MODES = POINT_MODES


class PatchError(RuntimeError):
    """A patch point could not be resolved, built or verified."""


@dataclass(frozen=True)
class PatchPoint:
    #: short stable id, e.g. "aot_autograd.create_subclass_metadata"
    name: str
    #: "module:attr" or "module:Class.attr"
    target: str
    #: build(original) -> replacement. ``original`` is the raw object found
    #: (the ``__dict__`` entry for class attributes, so a staticmethod stays
    #: a staticmethod) or ``None`` when ``new_attribute`` is set.
    build: Callable[[Any], Any]
    #: exact torch versions (public part, "2.11.0") this point applies to
    versions: frozenset[str]
    #: which install modes use it (members of ``MODES``)
    modes: frozenset[Mode]
    #: why torch needs this change (one line; shown by ``status``)
    reason: str
    #: modules that imported ``attr`` by name at module level
    rebinds: tuple[str, ...] = ()
    #: modules that keep torch's original under the name on purpose: the
    #: point replaces one importer's binding, not the function (install's
    #: check that no torch module still holds the original skips them)
    keeps_original_in: tuple[str, ...] = ()
    #: the same, for modules too costly to import at install: rebound if
    #: already imported (one imported while installed copies the
    #: replacement itself, and Journal.revert puts the original back)
    rebinds_if_loaded: tuple[str, ...] = ()
    #: functions ("module:qualname") with a parameter default that is the
    #: original (bound when the ``def`` ran, so rebinding module names does
    #: not reach it: ``partition_fn=default_partition``)
    default_args: tuple[str, ...] = ()
    #: the attribute does not exist on these versions and is added
    new_attribute: bool = False
    #: pytest node ids ("test/test_x.py::TestX::test_y") of the tests that
    #: fail when this point alone is left out (tools/ablate_points.py checks)
    guarded_by: tuple[str, ...] = ()
    #: non-empty for a point that changes no behaviour, only speed: the
    #: benchmark figure it is worth (such a point stays out of the series)
    speed_only: str = ""
    #: non-empty for a point that carries a later upstream fix into a torch
    #: release that lacks it: the upstream PR ("PR 188799"), and the issue
    #: it fixes where there is one (shown by ``status``)
    upstream_fix: str = ""
    #: "" for a point every install() of its version/mode applies; otherwise
    #: the name of an opt-in group (``install(dtensor=True)``: "dtensor")
    group: str = ""
    #: the commits and torch functions of the patch series
    #: (``patches/v<version>/``) this point is the backport of, as
    #: ``"NNNN path::qualname"`` entries (the patch number, the file, the
    #: changed function, ``Class.method``, class, module-level name,
    #: ``<imports>`` or ``<module>``); tools/series_map.py checks them
    #: against the series, both ways
    series: tuple[str, ...] = ()
    #: why a point that changes behaviour has no counterpart in the series
    #: (e.g. it only exists in forced mode); exclusive with ``series``
    series_none: str = ""
    #: names of the points this one needs installed with it: it reads state
    #: they leave (Note [State between points], patching/point_state.py) or
    #: calls what they add. Each applies to every torch version and mode
    #: this one does (test/points/test_point_layout.py); install() refuses a
    #: selection that has this point without them, and the ablation leaves
    #: this point out with them
    requires: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.modes <= MODES:
            raise ValueError(f"{self.name}: unknown modes {set(self.modes - MODES)}")
        module, sep, path = self.target.partition(":")
        if not sep or not module or not path or path.count(".") > 1:
            raise ValueError(
                f"{self.name}: target must be 'module:attr' or 'module:Class.attr', "
                f"got {self.target!r}"
            )
        # Note [Points and the series]
        # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
        # Every point is the backport of named series changes (series), or
        # says why it has none (series_none), or only makes the backport
        # faster (speed_only, which stays out of the series); exactly one of
        # the three. tools/series_map.py checks the
        # entries against patches/v<version>/ both ways.
        declared = [k for k in ("series", "series_none", "speed_only") if getattr(self, k)]
        if len(declared) != 1:
            raise ValueError(
                f"{self.name}: a patch point declares exactly one of `series` (the "
                "series changes it stands for), `series_none` (why it has none) or "
                f"`speed_only` (its measured gain); it declares {declared or 'none'} "
                "(see CONTRIBUTING.md, 'Points and the series')"
            )
        if isinstance(self.series, str):
            raise ValueError(f"{self.name}: `series` is a tuple of entries, not a string")
        for entry in self.series:
            if not SERIES_ENTRY.match(entry):
                raise ValueError(
                    f"{self.name}: series entry {entry!r} is not 'NNNN torch/path.py::qualname' "
                    "(patch number, file, changed function), e.g. '0001 torch/_functorch/"
                    "_aot_autograd/subclass_utils.py::create_subclass_metadata'"
                )

    @property
    def module_name(self) -> str:
        return self.target.partition(":")[0]

    @property
    def attr_path(self) -> tuple[str, ...]:
        return tuple(self.target.partition(":")[2].split("."))

    def series_summary(self) -> str:
        """What ``status`` shows: the series changes, or why there are none."""
        if self.speed_only:
            return f"speed-only: {self.speed_only}"
        if self.series_none:
            return f"not in the series: {self.series_none}"
        # "0001 torch/a.py::f, g; 0003 torch/b.py::h": one prefix per file
        parts: list[str] = []
        last = None
        for entry in self.series:
            where, _, unit = entry.partition("::")
            if where == last:
                parts[-1] += f", {unit}"
            else:
                parts.append(entry)
                last = where
        return "series " + "; ".join(parts)

    def applies_to(self, version: str, mode: Mode | str) -> bool:
        return version in self.versions and mode in self.modes


@dataclass
class _Slot:
    """One place an object is stored: ``owner.<attr>``."""

    owner: Any
    attr: str
    original: Any  # _MISSING if the attribute did not exist

    def ident(self) -> tuple:
        """Which place this is (two slots of stacked points share it)."""
        return (id(self.owner), self.attr)

    def current(self) -> Any:
        return self.owner.__dict__.get(self.attr, _MISSING)

    def set(self, value: Any) -> None:
        setattr(self.owner, self.attr, value)

    def restore(self) -> None:
        if self.original is _MISSING:
            if self.attr in self.owner.__dict__:
                delattr(self.owner, self.attr)
        else:
            setattr(self.owner, self.attr, self.original)

    def describe(self) -> str:
        owner = getattr(self.owner, "__qualname__", None) or getattr(
            self.owner, "__name__", repr(self.owner)
        )
        mod = getattr(self.owner, "__module__", "")
        prefix = f"{mod}." if isinstance(self.owner, type) and mod else ""
        return f"{prefix}{owner}.{self.attr}"


@dataclass
class _DefaultSlot(_Slot):
    """A parameter default of the function ``owner`` (``attr`` is
    ``__defaults__`` or ``__kwdefaults__``; ``key`` the index or the name)."""

    key: Any = None

    def ident(self) -> tuple:
        return (id(self.owner), self.attr, self.key)

    def current(self) -> Any:
        return getattr(self.owner, self.attr)[self.key]

    def set(self, value: Any) -> None:
        held = getattr(self.owner, self.attr)
        if isinstance(held, dict):
            setattr(self.owner, self.attr, {**held, self.key: value})
        else:
            setattr(self.owner, self.attr, held[: self.key] + (value,) + held[self.key + 1 :])

    def restore(self) -> None:
        self.set(self.original)

    def describe(self) -> str:
        return f"{self.owner.__module__}.{self.owner.__qualname__} default {self.key!r}"


def _default_slots(point: PatchPoint, original: Any) -> list[_DefaultSlot]:
    """The parameter defaults of ``point.default_args`` that hold ``original``."""
    slots = []
    for ref in point.default_args:
        mod_name, _, qualname = ref.partition(":")
        func = _import(mod_name)
        for part in qualname.split("."):
            func = getattr(func, part)
        found = [
            _DefaultSlot(func, "__defaults__", original, key=i)
            for i, d in enumerate(func.__defaults__ or ())
            if d is original
        ] + [
            _DefaultSlot(func, "__kwdefaults__", original, key=k)
            for k, d in (func.__kwdefaults__ or {}).items()
            if d is original
        ]
        if not found:
            raise PatchError(
                f"{point.name}: no parameter default of {ref} is the object at "
                f"{point.target}; the default_args list no longer matches this torch"
            )
        slots.extend(found)
    return slots


@dataclass
class _Applied:
    point: PatchPoint
    replacement: Any
    slots: list[_Slot] = field(default_factory=list)


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - report which point needed it
        raise PatchError(f"cannot import {name}: {type(e).__name__}: {e}") from e


def _resolve(point: PatchPoint) -> tuple[Any, str, Any]:
    """(owner, attr, original) for a point; original is _MISSING if absent."""
    owner = _import(point.module_name)
    *cls_path, attr = point.attr_path
    for part in cls_path:
        if not hasattr(owner, part):
            raise PatchError(f"{point.name}: {point.module_name} has no {part!r}")
        owner = getattr(owner, part)
    original = owner.__dict__.get(attr, _MISSING)
    if original is _MISSING and not point.new_attribute:
        raise PatchError(f"{point.name}: {point.target} does not exist on this torch")
    if original is not _MISSING and point.new_attribute:
        raise PatchError(
            f"{point.name}: {point.target} already exists; the point expects to add it"
        )
    return owner, attr, original


@dataclass
class _Plan:
    point: PatchPoint
    owner: Any
    attr: str
    original: Any
    replacement: Any
    rebind_modules: list[Any]
    default_slots: list[_DefaultSlot]
    #: Dynamo's rule for the torch original, which the replacement was
    #: given (dynamo_rules.SKIP / INLINE; None for a value that is not code)
    trace_rule: str | None = None


class Journal:
    """What an install changed, in order, so it can be undone exactly."""

    def __init__(self) -> None:
        self.applied: list[_Applied] = []

    def names(self) -> list[str]:
        return [a.point.name for a in self.applied]

    def revert(self) -> list[str]:
        """Undo in reverse order; returns problems (empty when clean).

        A torch module first imported *while* installed may have copied a
        replacement with ``from m import f``; those copies are put back to the
        original too, so no replacement outlives the install.
        """
        problems: list[str] = []
        for applied in reversed(self.applied):
            for slot in reversed(applied.slots):
                try:
                    slot.restore()
                except Exception as e:  # noqa: BLE001 - keep restoring the rest
                    problems.append(f"{slot.describe()}: {e}")
            main = applied.slots[0] if applied.slots else None
            if main is not None and isinstance(main.owner, ModuleType):
                for mod in _torch_modules_holding(applied.replacement, main.attr):
                    if main.original is _MISSING:
                        delattr(mod, main.attr)
                    else:
                        setattr(mod, main.attr, main.original)
        self.applied.clear()
        return problems


_lock = threading.RLock()


def plan(points: Sequence[PatchPoint]) -> list[_Plan]:
    """Resolve targets, import rebind modules and build every replacement.

    Touches nothing in torch; raises PatchError on the first problem.
    """
    last: dict[str, _Plan] = {}
    plans: list[_Plan] = []
    for point in points:
        below = last.get(point.target)
        if below is not None and not point.upstream_fix:
            raise PatchError(f"{point.name}: {point.target} is patched twice")
        owner, attr, original = _resolve(point)
        rebind_modules = []
        loaded = [m for m in point.rebinds_if_loaded if m in sys.modules]
        for mod_name in (*point.rebinds, *loaded):
            mod = _import(mod_name)
            held = mod.__dict__.get(attr, _MISSING)
            if held is not original:
                raise PatchError(
                    f"{point.name}: {mod_name}.{attr} is not the object at "
                    f"{point.target}; the rebind list no longer matches this torch"
                )
            rebind_modules.append(mod)
        # Note [Replacements keep the original's trace rule] (dynamo_rules):
        # torch's rule, also for a point stacked on another one
        rule = below.trace_rule if below is not None else _trace_rule(point, original)
        if below is not None:
            # An upstream fix stacks on the point that already replaces this
            # attribute (the 2.11 backport's version of the same function):
            # it wraps that replacement, and reverting it restores that
            # replacement (Journal.revert undoes points in reverse order).
            if point.rebinds != below.point.rebinds:
                raise PatchError(
                    f"{point.name}: stacks on {below.point.name} but names other rebinds"
                )
            original = below.replacement
        try:
            replacement = point.build(None if original is _MISSING else original)
        except Exception as e:
            raise PatchError(f"{point.name}: building the replacement failed: {e}") from e
        if rule is not None:
            dynamo_rules.keep_trace_rule(replacement, rule)
        if point.default_args and below is not None:
            raise PatchError(f"{point.name}: default_args on a stacked point")
        defaults = _default_slots(point, original)
        plans.append(
            _Plan(point, owner, attr, original, replacement, rebind_modules, defaults, rule)
        )
        last[point.target] = plans[-1]
    return plans


def _trace_rule(point: PatchPoint, original: Any) -> str | None:
    """Dynamo's rule for a torch original (None outside torch: a registry
    test's own module has no rule to keep)."""
    if not (point.module_name == "torch" or point.module_name.startswith("torch.")):
        return None
    return dynamo_rules.expected_rule(
        None if original is _MISSING else original, point.module_name
    )


def apply(
    points: Sequence[PatchPoint],
    self_check: Callable[[], None] | None = None,
) -> Journal:
    """Apply all points as one transaction. Returns the journal to revert with."""
    with _lock:
        plans = plan(points)
        journal = Journal()
        try:
            for p in plans:
                applied = _Applied(p.point, p.replacement)
                journal.applied.append(applied)
                slots = (
                    [_Slot(p.owner, p.attr, p.original)]
                    + [_Slot(m, p.attr, m.__dict__[p.attr]) for m in p.rebind_modules]
                    + p.default_slots
                )
                for slot in slots:
                    applied.slots.append(slot)
                    slot.set(p.replacement)
            verify(journal)
            if self_check is not None:
                self_check()
        except BaseException:
            journal.revert()
            raise
        return journal


def _torch_modules_holding(obj: Any, attr: str) -> list[ModuleType]:
    return [
        mod
        for name, mod in list(sys.modules.items())
        if (name == "torch" or name.startswith("torch."))
        and isinstance(mod, ModuleType)
        and mod.__dict__.get(attr, _MISSING) is obj
    ]


def verify(journal: Journal) -> None:
    """Every journaled slot holds its replacement, and no loaded torch module
    still holds a replaced module-level function under its name (a missing
    entry in a point's ``rebinds``)."""
    # a slot that stacked points share must hold the topmost replacement
    top: dict[tuple, Any] = {}
    for applied in journal.applied:
        for slot in applied.slots:
            top[slot.ident()] = applied.replacement
    for applied in journal.applied:
        for slot in applied.slots:
            if slot.current() is not top[slot.ident()]:
                raise PatchError(
                    f"{applied.point.name}: {slot.describe()} does not hold the "
                    "replacement after install"
                )
        main = applied.slots[0]
        if isinstance(main.owner, ModuleType) and main.original is not _MISSING:
            stale = [
                m for m in _torch_modules_holding(main.original, main.attr)
                if m.__name__ not in applied.point.keeps_original_in
            ]
            if stale:
                raise PatchError(
                    f"{applied.point.name}: {', '.join(m.__name__ for m in stale)} "
                    f"still hold the original {main.attr}; add them to the point's rebinds"
                )


def select(
    points: Iterable[PatchPoint], version: str, mode: Mode | str, groups: Iterable[str] = ()
) -> list[PatchPoint]:
    """The points for this torch version and mode: every ungrouped one, and
    those of the opt-in ``groups`` asked for."""
    groups = frozenset(groups)
    return [
        p for p in points if p.applies_to(version, mode) and (not p.group or p.group in groups)
    ]


def unmet_requirements(points: Sequence[PatchPoint]) -> list[tuple[PatchPoint, str]]:
    """(point, required name) for each ``requires`` entry of ``points`` that
    ``points`` does not hold."""
    names = {p.name for p in points}
    return [(p, r) for p in points for r in p.requires if r not in names]


def with_dependents(names: Iterable[str], points: Sequence[PatchPoint]) -> list[str]:
    """``names`` and every point of ``points`` that requires one of them,
    directly or through another: what must be left out together."""
    out = list(dict.fromkeys(names))
    grew = True
    while grew:
        grew = False
        for p in points:
            if p.name not in out and any(r in out for r in p.requires):
                out.append(p.name)
                grew = True
    return out
