"""Registered opaque members resolved when they are read (upstream PR 193452).

Upstream PR 193452 (open; issue 187505 items 3-4), carried into the backport
(series patch 0020) and the native releases (native+fixes, forced).

Releases and modes: 2.10.0, 2.11.0, 2.12.0, 2.12.1, 2.13.0, 2.14.0, 2.14.1
    (backport, forced, native+fixes); 2.14.0, 2.14.1 (native+fixes).
Series commits:
    patches/v2.10.0/0020-library-Resolve-registered-opaque-members-when-they-.patch.
Upstream: PR 193452 (open; issue 187505 items 3-4).

Registered opaque members resolved when read, not at every fakification
(upstream PR 193452, open; issue 187505 items 3-4).

Every release with opaque members (torch 2.11.0 to 2.14.1; 2.10.0 through
``install()``'s ``opaque_members``) builds the fake of a registered opaque
in ``maybe_to_fake_obj`` by reading *every* registered member off the real
object and storing it on the FakeScriptObject. Two consequences:

* a ``USE_REAL`` property runs at each fakification whether or not
  anything reads it (DeviceMesh registers over 25 members; a compile
  fakifies an opaque graph input or inner attr several times);
* an ``INLINED`` method is stored bound to the *real* object, so a subclass's
  ``__torch_dispatch__`` that calls it while AOTAutograd traces runs its
  body with the real receiver: a custom op the method calls on ``self``
  gets the real object, which the tracer bakes into the graph as a
  constant, and every later call acts on the object the graph was traced
  with instead of the one passed in.

The fix, in two points: ``maybe_to_fake_obj`` makes the fake of a
registered opaque without reading members (it only checks, statically, that
each one exists), and ``FakeScriptObject.__getattr__`` (which Python calls
only when normal lookup fails) resolves a registered member on first read:
an ``INLINED`` function is bound to the fake, anything else is read off the
real object with dispatch modes disabled, as the releases read it, and
kept on the fake (a snapshot, as before).
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

from .._torch_compat import BACKPORT_VERSIONS, FIXES_VERSIONS, is_registered_opaque_type
from ..patching.registry import PatchPoint
from ._versions import upstream_fix
from .opaque_members import missing_member_message

_FAKE_OWN = frozenset({"wrapped_obj", "script_class_name", "real_obj"})


def _member_kind(real: Any, name: str) -> Any:
    from torch._library import opaque_object as oo

    if real is None or not is_registered_opaque_type(type(real)):
        return None
    return oo.get_member_type(type(real), name)


def check_registered_members_exist(x: Any) -> None:
    """Refuse a registration that names a member the object lacks, without
    evaluating any (the releases' eager loop ran ``hasattr`` on each)."""
    from torch._library import opaque_object as oo

    info = oo.get_opaque_obj_info(type(x))
    members = getattr(info, "members", None) or {}
    if not members or inspect.getattr_static(type(x), "__getattr__", None) is not None:
        # a class with __getattr__ may provide any name: checked when read
        return
    for name in members:
        try:
            inspect.getattr_static(x, name)
        except AttributeError:
            raise TypeError(missing_member_message(x, name)) from None


def _build_maybe_to_fake_obj(original):
    @functools.wraps(original)
    def maybe_to_fake_obj(fake_mode, x):
        """Stands in for ``torch._library.fake_class_registry.
        maybe_to_fake_obj`` (torch 2.11.0, 2.12.x, 2.13.0, 2.14.x; on 2.10.0
        it wraps install()'s ``library.maybe_to_fake_obj`` copy) for a registered opaque
        object;
        TorchScript objects go to the wrapped function.

        Differs: the fake carries no member yet (``FakeScriptObject.
        __getattr__`` below resolves one when read) instead of every
        registered member read off ``x``; a registered member ``x`` lacks is
        still refused here.
        """
        from torch._library import fake_class_registry as fcr
        from torch._library import opaque_object as oo

        if not is_registered_opaque_type(type(x)) or x is None or fcr.tracing_with_real(x):
            return original(fake_mode, x)
        check_registered_members_exist(x)
        return fcr.FakeScriptObject(oo.FakeOpaqueObject(), oo.get_opaque_type_name(type(x)), x)

    return maybe_to_fake_obj


def _fake_getattr(self: Any, name: str) -> Any:
    """``FakeScriptObject.__getattr__`` (new; no release has one): the
    registered member ``name`` of the real opaque, resolved on first read.
    Anything else raises the AttributeError normal lookup raised."""
    if name in _FAKE_OWN or name.startswith("__"):
        raise AttributeError(name)
    try:
        real = object.__getattribute__(self, "real_obj")
    except AttributeError:
        raise AttributeError(name) from None
    kind = _member_kind(real, name)
    if kind is None:
        # the release's own message (its __getattribute__'s, where it has one)
        return type(self).__getattribute__(self, name)
    from torch._library.opaque_object import MemberType
    from torch.utils._python_dispatch import _disable_current_modes

    static = inspect.getattr_static(type(real), name, None)
    if kind is MemberType.INLINED and isinstance(static, types.FunctionType):
        # traced: its body sees the fake, as a graph input's does
        value = types.MethodType(static, self)
    else:
        with _disable_current_modes():
            value = getattr(real, name)
    object.__setattr__(self, name, value)
    return value


def _resolve_for_dynamo(fake: Any, name: str) -> None:
    """Put registered member ``name`` on ``fake`` before Dynamo reads it.
    Dynamo reads a member off the fake by normal lookup and would otherwise
    try to trace ``FakeScriptObject.__getattr__`` (a graph break)."""
    from torch._library.fake_class_registry import FakeScriptObject

    if not isinstance(fake, FakeScriptObject) or name in _FAKE_OWN or name.startswith("__"):
        return
    if name in object.__getattribute__(fake, "__dict__"):
        return
    try:
        real = object.__getattribute__(fake, "real_obj")
    except AttributeError:
        return
    if _member_kind(real, name) is None:
        return
    _fake_getattr(fake, name)  # kept on the fake


def _build_var_getattr(original):
    @functools.wraps(original)
    def getattr_hook(self, tx, name):
        """Wraps ``TorchScriptObjectVariable.var_getattr`` (torch 2.11.0, 2.12.x,
        2.13.0) and ``CustomClassObjectVariable.tp_getattro_impl`` (its
        name on torch 2.14.x). Differs: a registered member
        of a reference opaque's fake is resolved first (the fake no longer
        carries every member from the start: ``maybe_to_fake_obj`` above).
        """
        _resolve_for_dynamo(self.value, name)
        return original(self, tx, name)

    return getattr_hook


def _importers(*modules: str) -> tuple[str, ...]:
    """Those of ``modules`` whose source imports ``maybe_to_fake_obj`` by
    name (2.12 on: export's tracer and constant lifting; 2.14 also
    Inductor's IR), read without importing them."""
    import importlib.util

    found = []
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin:
            continue
        with open(spec.origin, encoding="utf-8") as f:
            if any(
                line.startswith("from torch._library.fake_class_registry import")
                and "maybe_to_fake_obj" in line
                for line in f
            ):
                found.append(name)
    return tuple(found)


_FIX = "PR 193452 (open; issue 187505 items 3-4)"


#: the Dynamo hook that reads an opaque's member, by release (2.14 renamed
#: it); torch 2.10's Dynamo (library.register_opaque_type & co.) reads members
#: off the real object, not the fake: nothing to resolve there
_LAZY_FROM_2_14 = tuple(v for v in FIXES_VERSIONS if v.startswith("2.14."))


_LAZY_BEFORE_2_14 = ("2.11.0", *(v for v in FIXES_VERSIONS if v not in _LAZY_FROM_2_14))


POINTS = [
    PatchPoint(
        name="library.maybe_to_fake_obj.lazy_members",
        target="torch._library.fake_class_registry:maybe_to_fake_obj",
        build=_build_maybe_to_fake_obj,
        reason="every registered member of an opaque was evaluated at each fakification, "
        "and INLINED methods were bound to the real object",
        upstream_fix=_FIX,
        series=(
            "0020 torch/_library/fake_class_registry.py::maybe_to_fake_obj",
            "0020 torch/_library/fake_class_registry.py::_check_registered_members_exist",
        ),
        rebinds_if_loaded=_importers(
            "torch._export.passes.lift_constants_pass", "torch.export._trace", "torch._inductor.ir"
        ),
        guarded_by=(
            "test/points/test_lazy_members.py::TestLazyMembers::test_unread_member_not_evaluated",
            "test/points/test_lazy_members.py::TestLazyMembers::test_inlined_member_side_effect_on_runtime_object",
        ),
        # not 2.10: install()'s library.maybe_to_fake_obj builds the
        # fake there, members unread (this point stacked on it would leave it
        # nothing to do)
        **upstream_fix("2.11.0", *FIXES_VERSIONS),
    ),
    PatchPoint(
        name="library.FakeScriptObject.__getattr__.lazy_members",
        target="torch._library.fake_class_registry:FakeScriptObject.__getattr__",
        build=lambda _original: _fake_getattr,
        new_attribute=True,
        reason="the fake of an opaque resolves a registered member when it is read",
        upstream_fix=_FIX,
        series=(
            "0020 torch/_library/fake_class_registry.py::FakeScriptObject.__getattr__",
            "0020 torch/_library/fake_class_registry.py::_resolve_registered_member",
        ),
        guarded_by=(
            "test/points/test_lazy_members.py::TestLazyMembers::test_member_read_by_dispatch",
            "test/points/test_lazy_members.py::TestLazyMembers::test_inlined_member_side_effect_on_runtime_object",
        ),
        # every release with opaque members: the native ones we patch, and
        # the backport (on 2.10, the fake library.maybe_to_fake_obj makes);
        # the series carry it as patch 0020
        **upstream_fix(*BACKPORT_VERSIONS, *FIXES_VERSIONS),
    ),
    PatchPoint(
        name="dynamo.TorchScriptObjectVariable.var_getattr.lazy_members",
        target="torch._dynamo.variables.script_object:TorchScriptObjectVariable.var_getattr",
        build=_build_var_getattr,
        reason="Dynamo reads a registered member off the fake of an opaque, which now "
        "resolves members when read",
        upstream_fix=_FIX,
        series=("0020 torch/_dynamo/variables/script_object.py::TorchScriptObjectVariable.var_getattr",),
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_member_reads_in_dynamo_cpu",
        ),
        **upstream_fix(*_LAZY_BEFORE_2_14),
    ),
    PatchPoint(
        name="dynamo.CustomClassObjectVariable.tp_getattro_impl.lazy_members",
        target="torch._dynamo.variables.script_object:CustomClassObjectVariable.tp_getattro_impl",
        build=_build_var_getattr,
        reason="Dynamo reads a registered member off the fake of an opaque, which now "
        "resolves members when read",
        upstream_fix=_FIX,
        series_none="torch 2.14's name of the hook; the series' bases (2.10, "
        "2.11) have var_getattr (the point above)",
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_member_reads_in_dynamo_cpu",
        ),
        **upstream_fix(*_LAZY_FROM_2_14),
    ),
]
