"""Opaque (non-tensor) attrs in a tensor subclass's ``__tensor_flatten__``
under ``torch.compile``, on the torch people already run.

    import torch_subclass_rt as tsrt
    tsrt.install()          # torch 2.10/2.11: patches; torch >= 2.12: native, plus the
                            # later upstream fixes a release lacks ("native+fixes")

    class Mesh(tsrt.OpaqueBase): ...
    tsrt.register_opaque(Mesh, typ="reference")

``install(force=True)`` on torch 2.13 replaces the native subclass runtime
with ours (used to prove the two are equivalent).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from . import _torch_compat
from ._modes import ACTIVE_MODES, Mode
from ._torch_compat import register_custom_class, register_opaque, torch_version
from .patching import registry

__all__ = [
    "install",
    "uninstall",
    "status",
    "installed",
    "Status",
    "Mode",
    "UnsupportedTorchVersion",
    "OpaqueBase",
    "CustomClassBase",
    "register_opaque",
    "register_custom_class",
]


class UnsupportedTorchVersion(RuntimeError):
    """install() has no patches for this torch; nothing was changed."""


@dataclass(frozen=True)
class Status:
    torch_version: str
    #: Mode.BACKPORT (2.11, patched), NATIVE (>= 2.12, nothing patched),
    #: NATIVE_FIXES (a native release patched only with the later upstream
    #: fixes it lacks), FORCED (2.13, our runtime replaces torch's; carries
    #: the fixes too), or OFF. A str enum: equal to "backport", ... too.
    mode: Mode
    #: names of the patch points currently applied
    points: tuple[str, ...] = field(default=())

    @property
    def active(self) -> bool:
        """Opaque attrs work under torch.compile right now."""
        return self.mode in ACTIVE_MODES

    def __repr__(self) -> str:
        return (
            f"Status(torch={self.torch_version}, mode={self.mode!r}, "
            f"{len(self.points)} patch point(s){': ' if self.points else ''}"
            f"{', '.join(self.points)})"
        )


_lock = threading.RLock()
_journal: registry.Journal | None = None
_mode = Mode.OFF
_groups: frozenset[str] = frozenset()


def _choose_mode(version: str, force: bool) -> Mode:
    if version in _torch_compat.BACKPORT_VERSIONS:
        return Mode.BACKPORT
    if _torch_compat.has_native_support(version):
        if not force:
            if version in _torch_compat.FIXES_VERSIONS:
                return Mode.NATIVE_FIXES
            return Mode.NATIVE
        if version in _torch_compat.FORCED_VERSIONS:
            return Mode.FORCED
        raise UnsupportedTorchVersion(
            f"install(force=True) on torch {version}: our runtime is verified "
            f"against torch {', '.join(_torch_compat.FORCED_VERSIONS)} only. "
            "Call install() without force to use the native support of this torch."
        )
    raise UnsupportedTorchVersion(
        f"torch {version} is not supported by torch_subclass_rt: it has patches "
        f"for torch {', '.join(_torch_compat.BACKPORT_VERSIONS)} and uses the "
        f"native support of torch >= {'.'.join(map(str, _torch_compat.NATIVE_SINCE))} "
        f"(force=True replaces it on {', '.join(_torch_compat.FORCED_VERSIONS)}). "
        "Nothing was changed. Install a supported torch, e.g. "
        f"`pip install torch=={_torch_compat.BACKPORT_VERSIONS[-1]}`."
    )


def install(force: bool = False, dtensor: bool = False) -> Status:
    """Make opaque attrs in ``__tensor_flatten__`` work under torch.compile.

    ``dtensor=True`` (opt-in; backport mode only changes anything) also gives
    DTensor torch 2.13's flatten, its ``device_mesh`` an inner attr: one
    compiled graph serves equal meshes and outputs carry the caller's mesh
    (points/dtensor.py). Off by default, so ``install()`` leaves DTensor as
    torch has it. Torch >= 2.13 flattens DTensor this way itself.

    Idempotent. All-or-nothing: if any patch point fails to apply or the
    post-install self-check fails, everything is restored and the error is
    raised. Raises :class:`UnsupportedTorchVersion` before touching anything
    on a torch it has no patches for.
    """
    global _journal, _mode, _groups
    with _lock:
        version = torch_version()
        mode = _choose_mode(version, force)
        groups = frozenset({"dtensor"} if dtensor else ())
        if _mode != Mode.OFF:
            # forced mode already carries the fixes (it stands for the
            # newest release), so a plain install() keeps it
            if (mode == _mode and groups == _groups) or (
                mode in (Mode.NATIVE, Mode.NATIVE_FIXES) and _mode == Mode.FORCED
            ):
                return status()
            uninstall()
        if mode == Mode.NATIVE:
            _mode = Mode.NATIVE
            return status()
        from .points import all_points
        from .install_check import check_installed

        known = all_points()
        selected = registry.select(known, version, mode, groups)
        if mode == Mode.BACKPORT:
            _check_groups_exist(version, groups, selected)
        points = _without_excluded(selected, known)
        _journal = registry.apply(points, self_check=check_installed)
        _mode = mode
        _groups = groups
        return status()


#: Comma-separated patch point names that install() leaves out. For
#: tools/ablate_points.py only (each point must make a test fail when it is
#: the one left out); a torch installed this way is deliberately incomplete.
EXCLUDE_ENV = "TSRT_EXCLUDE_POINTS"


def _check_groups_exist(version: str, groups: frozenset, selected: list) -> None:
    # an opt-in the backport of this release does not have (DTensor's
    # opaque-mesh flatten is 2.11's: torch 2.10's DTensor and its sharding
    # caches differ) is refused, not silently skipped
    missing = sorted(g for g in groups if not any(p.group == g for p in selected))
    if missing:
        raise ValueError(
            f"install({', '.join(f'{g}=True' for g in missing)}): torch {version}'s backport has "
            f"no {', '.join(missing)} group (DTensor's mesh as an inner attr is backported to "
            "torch 2.11.0 only; torch >= 2.13 flattens DTensor that way itself). Nothing was "
            "installed; call install() without it."
        )


def _without_excluded(points: list, known: list) -> list:
    import os

    raw = os.environ.get(EXCLUDE_ENV, "")
    names = {n.strip() for n in raw.split(",") if n.strip()}
    unknown = names - {p.name for p in known}
    if unknown:
        raise ValueError(
            f"{EXCLUDE_ENV} names no patch point: {', '.join(sorted(unknown))} "
            "(`python -m torch_subclass_rt status --install` lists them)"
        )
    kept = [p for p in points if p.name not in names]
    unmet = registry.unmet_requirements(kept)
    if unmet and not names:
        point, needed = unmet[0]
        raise registry.PatchError(
            f"patch point {point.name} requires {needed}, which does not apply to this torch "
            "and mode: a bug in torch_subclass_rt's registry (test/points/test_point_layout.py "
            "checks it); nothing was installed"
        )
    if unmet:
        point, needed = unmet[0]
        raise ValueError(
            f"{EXCLUDE_ENV} leaves out {needed}, which {point.name} requires; nothing was "
            f"installed. Leave out {point.name} too (tools/ablate_points.py does), or keep "
            f"{needed}."
        )
    return kept


def uninstall() -> Status:
    """Restore every object install() replaced (the very same objects).

    After a backport install this also resets Dynamo (``torch._dynamo.reset()``):
    code compiled while installed holds subclass metadata that only our
    runtime can read (torch 2.11 has no ``OpaqueMeta``), so it must not run
    afterwards; functions recompile on their next call. (Forced mode's
    metadata is torch's own, so nothing is reset there.) A backward still
    pending on an output computed while installed cannot run after
    ``uninstall()``.
    """
    global _journal, _mode, _groups
    with _lock:
        _groups = frozenset()
        if _journal is not None:
            was = _mode
            problems = _journal.revert()
            _journal = None
            if was == Mode.BACKPORT:
                import torch._dynamo

                torch._dynamo.reset()
            if problems:
                _mode = Mode.OFF
                raise registry.PatchError(
                    "uninstall could not restore: " + "; ".join(problems)
                )
        _mode = Mode.OFF
        return status()


def status() -> Status:
    with _lock:
        names = tuple(_journal.names()) if _journal is not None else ()
        return Status(torch_version(), _mode, names)


@contextlib.contextmanager
def installed(force: bool = False, dtensor: bool = False) -> Iterator[Status]:
    """``with installed(): ...`` — install for the block, then return to the
    state before it (uninstalled if it was off, the previous mode otherwise)."""
    with _lock:
        before, before_groups = _mode, _groups
        st = install(force=force, dtensor=dtensor)
    try:
        yield st
    finally:
        with _lock:
            if _mode != before or _groups != before_groups:
                uninstall()
                if before != Mode.OFF:
                    install(force=(before == Mode.FORCED), dtensor="dtensor" in before_groups)


def __getattr__(name: str) -> Any:
    # Resolved lazily: the base class differs per torch (see _torch_compat).
    # CustomClassBase: torch 2.14's name for the same class
    if name in ("OpaqueBase", "CustomClassBase"):
        return _torch_compat.opaque_base()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
