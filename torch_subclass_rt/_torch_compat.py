"""Which torch is this, and what do its opaque-object APIs look like.

Everything version-dependent that the rest of the package needs to *ask* lives
here; everything version-dependent that it needs to *change* lives in
``points/``. ``runtime/`` only ever calls the helpers below.

Opaque API across releases:

=========  ===========================  ====================================
torch      base class                   registration
=========  ===========================  ====================================
2.10       ours: _opaque_base.OpaqueBase register_opaque_type(cls, *, typ);
           (no torch._opaque_base)      guard_fn / members once install() ran
2.11–2.13  torch._opaque_base.OpaqueBase register_opaque_type(cls, typ=...)
>=2.14     torch._custom_class_base.    register_custom_class(cls, typ=
           CustomClassBase               "symbolic"|"constant")
=========  ===========================  ====================================

torch 2.14 renamed the opaque API (upstream PRs 188455, 188456, 188460,
188461) and keeps the old names as aliases that log "... is deprecated"
through ``logging`` each time they are used (importing
``torch._opaque_base`` logs once). The package asks through the helpers
below, which use 2.14's name where torch has it and the old one before:

=============================  ==============================  =========================
old name (torch <= 2.13)       torch >= 2.14                   helper here
=============================  ==============================  =========================
torch._opaque_base.OpaqueBase  torch._custom_class_base.       :func:`opaque_base`
                               CustomClassBase
register_opaque_type(typ=      register_custom_class(typ=      :func:`register_opaque`
"reference"|"value")           "symbolic"|"constant")
is_opaque_type                 is_custom_class                 :func:`is_registered_opaque_type`
is_opaque_value                is_custom_class_obj             :func:`is_registered_opaque_object`
is_opaque_value_type           is_opaque_constant_type         :func:`is_value_opaque_type`
is_opaque_reference_type       is_opaque_symbolic_type         :func:`is_reference_opaque_type`
=============================  ==============================  =========================

test/patching/test_no_deprecation.py checks that install(), a compile and
uninstall() log none of those warnings.
"""

from __future__ import annotations

import functools
import importlib
import re
import sys
from typing import Any

import torch

#: torch releases whose sources the backport points were written against.
#: The points edit/replace functions of these exact releases; a point release
#: may move code around, so every other version is refused.
BACKPORT_VERSIONS: tuple[str, ...] = ("2.10.0", "2.11.0")
#: releases on which ``install(force=True)`` replaces the native runtime.
FORCED_VERSIONS: tuple[str, ...] = ("2.13.0",)
#: first release with native opaque attrs in ``__tensor_flatten__`` (PR 176457).
NATIVE_SINCE: tuple[int, int] = (2, 12)
#: native releases that lack later upstream fixes to this feature; install()
#: applies the fix points there (mode "native+fixes"; Note [Upstream fixes]
#: in points/__init__.py). A native release not listed here has no known bug
#: and stays "native".
FIXES_VERSIONS: tuple[str, ...] = ("2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1")


def torch_version() -> str:
    """The public part of ``torch.__version__`` ("2.11.0+cu128" -> "2.11.0")."""
    return str(torch.__version__).split("+", 1)[0]


_RELEASE_PART = re.compile(r"\d+")


def version_tuple(version: str | None = None) -> tuple[int, ...]:
    """(major, minor, patch) of a torch version string (default: the running
    torch), e.g. "2.13.0a0+git1234" -> (2, 13, 0), "2.12.0rc1" -> (2, 12, 0).

    The one version parser of the package and its tests (test/harness.py's
    ``torch_major_minor`` is its first two numbers). A part counts up to its
    first non-digit, so a pre-release suffix never leaks into the number;
    parsing stops at the first part that does not start with a digit.
    """
    parts = []
    for piece in (version or torch_version()).split("+", 1)[0].split("."):
        m = _RELEASE_PART.match(piece)
        if m is None:
            break
        parts.append(int(m.group()))
        if len(parts) == 3:
            break
    return tuple(parts)


def has_native_support(version: str | None = None) -> bool:
    return version_tuple(version)[:2] >= NATIVE_SINCE


def _module(name: str) -> Any:
    # sys.modules first: import_module takes the import lock and costs
    # about a microsecond, and the opaque-type checks that call this run
    # once per FX argument while tracing (thousands per compile at N=1000)
    mod = sys.modules.get(name)
    return mod if mod is not None else importlib.import_module(name)


@functools.cache
def opaque_base() -> type:
    """The class user opaques derive from on this torch."""
    # not torch._opaque_base first: on 2.14 importing it logs a deprecation
    try:
        return _module("torch._custom_class_base").CustomClassBase
    except ImportError:  # torch <= 2.13
        pass
    try:
        return _module("torch._opaque_base").OpaqueBase
    except ImportError:  # torch 2.10: Note [OpaqueBase on torch 2.10]
        return _package_opaque_base()


def _package_opaque_base() -> type:
    from . import _opaque_base

    return _opaque_base.OpaqueBase


def _opaque_api(new: str, old: str) -> Any:
    """``torch._library.opaque_object``'s function ``new`` (its torch >= 2.14
    name), else ``old`` (the name before, deprecated on 2.14). Looked up at
    each call, not cached: install() may replace either (on 2.10)."""
    mod = _opaque_object_module()
    fn = getattr(mod, new, None)
    return fn if fn is not None else getattr(mod, old)


def has_opaque_members() -> bool:
    """Whether this torch's opaque registration takes ``guard_fn`` and
    ``members`` (what Dynamo may read off an opaque): torch >= 2.11, and
    torch 2.10 while ``install()`` is active (points/opaque_members.py)."""
    return hasattr(_opaque_object_module(), "MemberType")


def _opaque_object_module() -> Any:
    return _module("torch._library.opaque_object")


#: the package's names for the two kinds (torch 2.11 - 2.13's) -> torch
#: 2.14's (``register_custom_class``'s ``typ``); the package takes both
_TYP_2_14 = {"reference": "symbolic", "value": "constant"}
_TYP_BEFORE_2_14 = {new: old for old, new in _TYP_2_14.items()}


def register_opaque(cls: type, typ: str = "reference", **kwargs: Any) -> type:
    """Register ``cls`` as an opaque type, spelled the same on every torch.

    ``typ`` is ``"reference"`` (identity matters: a mesh, a process group; the
    object flows through the graph as an input) or ``"value"`` (compared by
    ``__eq__``, baked into the graph as a constant); torch 2.14's names for
    them, ``"symbolic"`` and ``"constant"``, are taken on every release, so
    code written for 2.14 registers on 2.10 too. Extra keyword arguments
    (``guard_fn``, ``members``, ``hoist``) go to torch unchanged.
    Returns ``cls`` so it can be used as a decorator argument.
    """
    kind = _TYP_BEFORE_2_14.get(typ, typ)
    if kind not in ("reference", "value"):
        raise ValueError(
            f"register_opaque({cls.__name__}, typ={typ!r}): typ must be "
            "'reference' (compared by identity, passed as a graph input; torch "
            "2.14 calls it 'symbolic') or 'value' (compared by __eq__, baked into "
            "the graph; 2.14: 'constant')"
        )
    mod = _opaque_object_module()
    if opaque_base() is _package_opaque_base():  # torch 2.10
        _check_registrable_on_2_10(cls, kwargs)
    new_api = getattr(mod, "register_custom_class", None)
    if new_api is not None:  # torch >= 2.14: its names, without its deprecation warning
        new_api(cls, typ=_TYP_2_14[kind], **kwargs)
    else:
        mod.register_opaque_type(cls, typ=kind, **kwargs)
    return cls


def register_custom_class(cls: type, *, typ: str, **kwargs: Any) -> type:
    """torch 2.14's ``torch._library.opaque_object.register_custom_class``,
    spelled the same (``typ`` keyword-only, ``"symbolic"`` or
    ``"constant"``), on every release: :func:`register_opaque` under 2.14's
    name, for code written against 2.14. Returns ``cls``."""
    return register_opaque(cls, typ=typ, **kwargs)


def _check_registrable_on_2_10(cls: type, kwargs: dict[str, Any]) -> None:
    # 2.11's register_opaque_type requires the OpaqueBase metaclass; 2.10's
    # does not, but everything that recognizes an opaque (our runtime and
    # points, like torch 2.12's code) asks isinstance(x, OpaqueBase).
    if not isinstance(cls, type(opaque_base())):
        raise TypeError(
            f"register_opaque({cls.__qualname__}): on torch {torch_version()} an "
            "opaque type must subclass torch_subclass_rt.OpaqueBase (torch 2.10 "
            "has no torch._opaque_base; the package provides it). Declare "
            f"`class {cls.__name__}(tsrt.OpaqueBase): ...`."
        )
    if kwargs and not has_opaque_members():
        raise TypeError(
            f"register_opaque({cls.__qualname__}, {', '.join(f'{k}=...' for k in kwargs)}): "
            f"torch {torch_version()} cannot take {', '.join(sorted(kwargs))} before "
            "torch_subclass_rt.install(): opaque members and guard_fn (what compiled "
            "code may read off an opaque, and guards on it) came with torch 2.11, "
            "and install() gives them to 2.10. Call tsrt.install() first, or register "
            "without them (compiled code then passes the opaque through without "
            "reading it)."
        )


def is_opaque_object(value: object) -> bool:
    """True for an instance of a registered opaque type, or its FakeScriptObject.

    The bare ``isinstance`` against this torch's base class; code asking
    about an inner attr calls :func:`is_opaque_attr`."""
    return isinstance(value, opaque_base())


def is_opaque_attr(value: object, *, fake: bool | None = None) -> bool:
    """Whether ``value``, an inner attr named by ``__tensor_flatten__`` (or
    the value in such an attr's flat slot), is an opaque object.

    The one predicate for "an opaque among flatten attrs": the runtime and
    every patch point call it, in Python and from edited torch source.
    ``fake`` narrows it: None (default) -- the real object or its
    ``FakeScriptObject`` (what tracing puts in its place); False -- only
    the real object, not yet fakeified; True -- only a ``FakeScriptObject``.

    A tensor is never an opaque. Testing it first is cheap (no metaclass
    ``__instancecheck__`` for the common case) and changes no answer:
    registering an opaque type requires ``OpaqueBaseMeta``, which cannot be
    combined with ``torch.Tensor``'s metaclass. Whether an opaque is a
    reference or a value type is a separate question
    (:func:`is_reference_opaque_type` of ``type(unwrap_fake_opaque(v))``).

    Not covered on purpose: "any FakeScriptObject" (TorchScript objects
    included; Dynamo's op-output checks in ``points/dynamo_opaque_inputs.py``), and
    unwrapping a FakeScriptObject whose ``real_obj`` may be missing
    (``points/tracing.py``, ``points/dtensor.py``).
    """
    if isinstance(value, torch.Tensor) or not is_opaque_object(value):
        return False
    if fake is None:
        return True
    return (unwrap_fake_opaque(value) is not value) == fake


def unwrap_fake_opaque(value: Any) -> Any:
    """The real object behind a FakeScriptObject (identity otherwise)."""
    from torch._library.fake_class_registry import FakeScriptObject

    if isinstance(value, FakeScriptObject):
        return object.__getattribute__(value, "real_obj")
    return value


def is_reference_opaque_type(cls: type) -> bool:
    """Registered as a reference-type opaque ("reference"; 2.14 spells it
    "symbolic")."""
    mod = _opaque_object_module()
    fn = getattr(mod, "is_opaque_symbolic_type", None) or getattr(
        mod, "is_opaque_reference_type", None
    )
    if fn is not None:
        return bool(fn(cls))
    return is_registered_opaque_type(cls) and not is_value_opaque_type(cls)


def is_registered_opaque_type(cls: type | str) -> bool:
    """``cls`` (a class, or a registered type name) is a registered opaque
    type, or a subclass of one."""
    return bool(_opaque_api("is_custom_class", "is_opaque_type")(cls))


def is_registered_opaque_object(value: object) -> bool:
    """``value`` is an instance of a registered opaque type, or a
    FakeScriptObject of one (torch >= 2.13's ``is_opaque_value``; 2.14's
    ``is_custom_class_obj``). Asks the registry, never ``isinstance``."""
    mod = _opaque_object_module()
    fn = getattr(mod, "is_custom_class_obj", None)
    if fn is not None:
        return bool(fn(value))
    from torch._library.fake_class_registry import FakeScriptObject

    if isinstance(value, FakeScriptObject):
        # not getattr: a FakeScriptObject answers unknown names itself
        value = object.__getattribute__(value, "__dict__").get("real_obj")
    return value is not None and is_registered_opaque_type(type(value))


def is_value_opaque_type(cls: type) -> bool:
    """Registered as a value-type opaque ("value"; 2.14 spells it "constant")."""
    fn = _opaque_api("is_opaque_constant_type", "is_opaque_value_type")
    try:
        return bool(fn(cls))
    except Exception:  # noqa: BLE001 - e.g. an unhashable or odd class object
        return False
