"""Opaque members and ``guard_fn``: torch 2.11's registration, on torch 2.10.

The part of series patch 0000 (v2.10.0 only) that gives torch 2.10 the
registered members, ``MemberType`` and ``guard_fn`` of torch 2.11's
``register_opaque_type``, and Dynamo's reads and guards of them.

Releases and modes: 2.10.0 (backport).
Series commits:
    patches/v2.10.0/0000-aot_autograd-dynamo-inductor-Opaque-objects-saved-fo.patch.
Upstream: none (not an upstream fix).

Opaque members and ``guard_fn``, as torch 2.11 has them, for torch 2.10.

torch 2.11 lets an opaque registration say what compiled code may read off
the object (``members={name: MemberType.USE_REAL | INLINED}``) and what to
guard on (``guard_fn``); DeviceMesh / ProcessGroup as opaques
(``distributed_opaques.py``) and a sharded subclass whose dispatch reads
``mesh.size()`` while tracing build on both. torch 2.10 registers a type
with a name and a kind only, sets nothing on the FakeScriptObject that
stands in for the object, refuses every attribute of a reference opaque in
Dynamo ("Attribute/method access of OpaqueObjects is not supported") and
guards a reference opaque on its type alone, so a mesh with other ranks
would reuse a graph traced for another one.

The points (patch 0000 of the v2.10.0 series, "what torch 2.11 has"):

* ``opaque_object.MemberType`` (new): the enum of member kinds.
* ``opaque_object.register_opaque_type``: takes ``guard_fn`` and ``members``
  (2.11's keywords; ``hoist``, for value types, is not carried: 2.10's
  Dynamo cannot lift a value opaque).
* ``opaque_object.get_opaque_obj_info`` / ``get_member_type`` (new).
* ``maybe_to_fake_obj`` (``library.maybe_to_fake_obj``): the fake
  carries each registered member, read off the real object.
* ``TorchScriptObjectVariable.var_getattr`` / ``call_method``: Dynamo
  follows the registered members (``USE_REAL``: evaluated on the real object
  at trace time, the result a constant; ``INLINED``: a ``call_method`` node
  on the opaque input); an unregistered member is a hard error naming it.
* ``GuardBuilder.OPAQUE_OBJ_GUARD_FN_MATCH`` (new), installed for a
  reference opaque graph input by the 2.10 variant of
  ``dynamo.VariableBuilder._wrap``.

Every point is ``ONLY_2_10``: torch 2.11 has all of it.
"""

from __future__ import annotations

import copy
import enum
import inspect
from dataclasses import dataclass, field
from typing import Any

from ..patching.registry import PatchPoint
from ..patching.source_edit import Edit, edited_function
from ._versions import ONLY_2_10

_OO = "torch._library.opaque_object"


class MemberType(enum.Enum):
    """How compiled code treats a member of an opaque (torch 2.11's
    ``torch._library.opaque_object.MemberType``; installed there on 2.10)."""

    #: read / called on the real object at trace time; the result is a constant
    USE_REAL = "use_real"
    #: traced: a method call becomes a node on the opaque graph input
    INLINED = "inlined"


def opaque_type_info(cls: Any, class_name: str, typ: str, guard_fn: Any, members: Any) -> Any:
    """torch 2.10's ``_OpaqueTypeInfo`` with 2.11's ``guard_fn`` and
    ``members``. Called by the edited ``register_opaque_type``.

    Note [Opaque member registration errors]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    The messages below are also the v2.10.0 series' (patch 0000,
    ``register_opaque_type`` and ``maybe_to_fake_obj``, worded as torch 2.11
    words them); keep them in sync."""
    from torch._library import opaque_object

    members = dict(members or {})
    for name, kind in members.items():
        if not isinstance(kind, MemberType):
            raise TypeError(
                f"register_opaque_type({cls.__qualname__}, members={{{name!r}: {kind!r}}}): "
                "each member's kind must be a torch._library.opaque_object.MemberType "
                "(MemberType.USE_REAL or MemberType.INLINED)"
            )
    if typ == "value" and guard_fn is not None:
        # torch 2.11's words, as the v2.10.0 series' patch 0000
        raise TypeError(
            f"No need to specify `guard_fn` for value-type opaque class {cls} as it "
            "will be guarded based on `__eq__`."
        )
    return _info_class(opaque_object._OpaqueTypeInfo)(class_name, typ, guard_fn, members)


_INFO_CLASSES: dict[type, type] = {}


def _info_class(base: type) -> type:
    # a subclass of torch's dataclass, so code reading class_name /
    # opaque_typ is unchanged; made once per base class
    cls = _INFO_CLASSES.get(base)
    if cls is None:

        @dataclass
        class _OpaqueTypeInfo(base):  # type: ignore[misc, valid-type]
            guard_fn: Any = None
            members: dict = field(default_factory=dict)

        cls = _INFO_CLASSES[base] = _OpaqueTypeInfo
    return cls


def get_opaque_obj_info(cls: Any) -> Any:
    """The registration of an opaque type (a class or its registered name),
    or None (torch 2.11's ``get_opaque_obj_info``)."""
    from torch._library import opaque_object as oo

    from .._torch_compat import is_registered_opaque_type

    if not is_registered_opaque_type(cls):
        return None
    return oo._OPAQUE_TYPES_BY_NAME[cls] if isinstance(cls, str) else oo._OPAQUE_TYPES[cls]


def get_member_type(cls: Any, name: str) -> MemberType | None:
    """How member ``name`` of opaque type ``cls`` is registered (None: not
    registered; a type registered before ``install()`` has no members)."""
    from torch._library import opaque_object as oo

    info = oo.get_opaque_obj_info(cls)
    return None if info is None else getattr(info, "members", {}).get(name)


def set_registered_members(fake: Any, real: Any) -> None:
    """Put each registered member of ``real`` on its FakeScriptObject, as
    torch 2.11's ``maybe_to_fake_obj`` does (a method stays bound to the
    real object). Called by the edited ``maybe_to_fake_obj``."""
    from torch._library import opaque_object as oo
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    info = oo.get_opaque_obj_info(type(real))
    members = getattr(info, "members", None)
    if not members:
        return
    for name in members:
        with unset_fake_temporarily():
            # the series' maybe_to_fake_obj (v2.10.0 patch 0000) raises the
            # same message: Note [Opaque member registration errors]
            if not hasattr(real, name):
                raise TypeError(missing_member_message(real, name))
            value = getattr(real, name)
        object.__setattr__(fake, name, value)


def missing_member_message(obj: Any, name: str) -> str:
    """A registered member ``name`` that ``obj`` does not have, in torch
    2.11's words (2.11 - 2.14 say it so; on 2.10 the series' patch 0000):
    one text on every release, raised here and by ``lazy_members``."""
    from torch._library.opaque_object import get_opaque_type_name

    return (
        f"Opaque object of type '{get_opaque_type_name(type(obj))}' was specified to have "
        f"member '{name}', but this doesn't actually exist in the object."
    )


def _build_register_opaque_type(original):
    """``torch._library.opaque_object.register_opaque_type`` (torch 2.10.0)
    with two edits. Differs from 2.10, as 2.11: it takes ``guard_fn`` and
    ``members`` and keeps them on the registration. 2.11's requirement that
    the class derive from ``OpaqueBase`` stays ``tsrt.register_opaque``'s
    (``_torch_compat._check_registrable_on_2_10``): code that registers
    through torch 2.10's own function keeps working under ``install()``.
    Note [install() is transparent without opaques]: identical for a call
    without them."""
    return edited_function(
        original,
        [
            Edit(
                "def register_opaque_type(cls: Any, *, typ: str) -> None:",
                "def register_opaque_type(cls: Any, *, typ: str, guard_fn: Any = None, members: Any = None) -> None:",
            ),
            Edit(
                "type_info = _OpaqueTypeInfo(name, typ)",
                "type_info = __tsrt__.opaque_type_info(cls, name, typ, guard_fn, members)",
            ),
            # a value type written for torch >= 2.11 (__fx_repr__, the
            # default __repr__) registers too: the FX codegen below calls it
            Edit(
                "if cls.__repr__ is object.__repr__:  # type: ignore[comparison-overlap]",
                "if cls.__repr__ is object.__repr__ and not hasattr(cls, \"__fx_repr__\"):  # type: ignore[comparison-overlap]",
            ),
            Edit(
                """
                "expected to have a non-default `__repr__` "
                "implementation as we will use this to reconstruct "
                "the object in the FX codegen."
                """,
                """
                "expected to have a non-default `__repr__` "
                "implementation (or a `__fx_repr__`, as torch 2.11 asks) "
                "as we will use this to reconstruct "
                "the object in the FX codegen."
                """,
            ),
        ],
    )


def opaque_value_repr(arg: Any, add_global: Any) -> str:
    """How the FX codegen writes a value-type opaque constant (torch 2.10,
    as 2.11): through the object's ``__fx_repr__`` (its code and the globals
    that code names) where it has one, else 2.10's ``repr`` and its type's
    name. Called by the edited ``CodeGen._gen_python_code``; the v2.10.0
    series (patch 0000) makes the same edit."""
    fx_repr = getattr(arg, "__fx_repr__", None)
    if fx_repr is None:
        add_global(type(arg).__name__, type(arg))
        return repr(arg)
    code, globals_ = fx_repr()
    for name, obj in globals_.items():
        add_global(name, obj)
    return code


def _build_gen_python_code(original):
    """``torch.fx.graph.CodeGen._gen_python_code`` (torch 2.10.0) with one
    edit. Differs from 2.10, as 2.11: a value-type opaque constant is
    written with its ``__fx_repr__`` where it has one
    (:func:`opaque_value_repr`). Note [install() is transparent without
    opaques]: identical for every other argument, and for a value type
    without ``__fx_repr__``."""
    return edited_function(
        original,
        [
            Edit(
                """
                add_global(arg_type.__name__, arg_type)
                return repr(arg)
                """,
                """
                return __tsrt__.opaque_value_repr(arg, add_global)
                """,
            ),
        ],
    )


def _real_opaque(vt: Any) -> Any:
    """The real reference opaque behind a TorchScriptObjectVariable's fake,
    or None (a TorchScript object, a value opaque, a fake without one)."""
    from torch._library.fake_class_registry import FakeScriptObject

    from .._torch_compat import is_reference_opaque_type, unwrap_fake_opaque

    value = vt.value
    if not isinstance(value, FakeScriptObject):
        return None
    real = unwrap_fake_opaque(value)
    if real is None or not is_reference_opaque_type(type(real)):
        return None
    return real


def _member_kind(real: Any, name: str) -> MemberType:
    """How member ``name`` of the real opaque is registered; an unregistered
    one is a graph break (a hard error under the callers' decorator) that
    names it and the registration."""
    from torch._dynamo.exc import unimplemented
    from torch._library import opaque_object as oo

    from ..runtime import errors

    kind = oo.get_member_type(type(real), name)
    if kind is not None:
        return kind
    info = oo.get_opaque_obj_info(type(real))
    msg = str(errors.unregistered_opaque_member_error(type(real), name, sorted(getattr(info, "members", {}))))
    unimplemented(
        gb_type="Attempted to access unregistered member on an OpaqueObject",
        context=f"value={real}, attr={name}",
        explanation=msg,
        hints=[f"Register '{name}' with a MemberType in register_opaque_type(members=...)."],
    )


def _member_getattr(self: Any, tx: Any, name: str, real: Any) -> Any:
    from torch._dynamo.source import AttrSource
    from torch._dynamo.variables.base import VariableTracker
    from torch._dynamo.variables.misc import LambdaVariable

    kind = _member_kind(real, name)
    value = getattr(real, name)
    if inspect.ismethod(value) and (kind is MemberType.USE_REAL or self.source is None):
        # a call of it goes through call_method (evaluated, or a node)
        return LambdaVariable(lambda *args, **kwargs: self.call_method(tx, name, list(args), kwargs))
    # The real object's attribute, through its source where the opaque has
    # one (guarded like any attribute of an input), else a constant. Not
    # read off the fake: 2.10's Dynamo refuses to trace
    # FakeScriptObject.__getattribute__.
    if self.source is None:
        return VariableTracker.build(tx, value)
    return VariableTracker.build(tx, value, AttrSource(self.source, name))


def _member_call(self: Any, tx: Any, name: str, args: Any, kwargs: Any, real: Any) -> Any:
    from torch._dynamo.exc import unimplemented
    from torch._dynamo.utils import proxy_args_kwargs
    from torch._dynamo.variables.base import VariableTracker
    from torch._dynamo.variables.builder import wrap_fx_proxy
    from torch._dynamo.variables.constant import ConstantVariable
    from torch.utils import _pytree as pytree

    from .._torch_compat import is_reference_opaque_type

    kind = _member_kind(real, name)
    if kind is MemberType.INLINED:
        proxy_args, proxy_kwargs = proxy_args_kwargs(args, kwargs)
        proxy = tx.output.create_proxy("call_method", name, (self.proxy, *proxy_args), proxy_kwargs)
        return wrap_fx_proxy(tx=tx, proxy=proxy)
    if inspect.getattr_static(type(real), "__getattr__", None) is not None:
        unimplemented(
            gb_type="Opaque object with custom __getattr__ not supported",
            context=f"{type(real).__name__}.{name}",
            explanation=f"{type(real).__name__} defines __getattr__, so a USE_REAL member "
            "cannot be evaluated safely at trace time",
            hints=["Register the member as MemberType.INLINED, or call it outside torch.compile."],
        )
    const_args = [a.as_python_constant() for a in args]
    const_kwargs = {k: v.as_python_constant() for k, v in kwargs.items()}
    result = getattr(real, name)(*const_args, **const_kwargs)
    if name == "__setattr__":
        return ConstantVariable.create(None)
    if any(is_reference_opaque_type(type(leaf)) for leaf in pytree.tree_leaves(result)):
        unimplemented(
            gb_type="USE_REAL member of an opaque returned a reference-type opaque",
            context=f"{type(real).__name__}.{name}",
            explanation="a reference opaque must be a graph input to be guarded, and a "
            "value computed at trace time has no source to make it one",
            hints=[f"Register '{name}' as MemberType.INLINED."],
        )
    return VariableTracker.build(tx, result)


def _build_var_getattr(original):
    from torch._dynamo.variables.script_object import _raise_hard_error_if_graph_break

    @_raise_hard_error_if_graph_break("Dynamo cannot safely trace script object due to graph break.")
    def var_getattr(self, tx, name):
        """Wraps ``torch._dynamo.variables.script_object.
        TorchScriptObjectVariable.var_getattr`` (torch 2.10.0). Differs from
        2.10, as 2.11: a member of a reference opaque is read as its
        registration says (module docstring) instead of being refused.
        Note [install() is transparent without opaques]: delegation
        (TorchScript objects and value opaques go to torch's)."""
        real = _real_opaque(self)
        if real is None:
            return original(self, tx, name)
        return _member_getattr(self, tx, name, real)

    return var_getattr


def _build_call_method(original):
    from torch._dynamo.variables.script_object import _raise_hard_error_if_graph_break

    @_raise_hard_error_if_graph_break("Dynamo cannot safely trace script object due to graph break.")
    def call_method(self, tx, name, args, kwargs):
        """Wraps ``TorchScriptObjectVariable.call_method`` (torch 2.10.0,
        which refuses every call). Differs from 2.10, as 2.11: a registered
        member of a reference opaque is evaluated (USE_REAL) or traced
        (INLINED). Note [install() is transparent without opaques]:
        delegation."""
        real = _real_opaque(self)
        if real is None:
            return original(self, tx, name, args, kwargs)
        return _member_call(self, tx, name, args, kwargs, real)

    return call_method


def OPAQUE_OBJ_GUARD_FN_MATCH(self: Any, guard: Any) -> None:
    """``GuardBuilder.OPAQUE_OBJ_GUARD_FN_MATCH`` for torch 2.10 (new; torch
    2.11 has it): the values the type's ``guard_fn`` returns must equal
    those of the object the graph was traced with. 2.10's lambda guards take
    (fn, verbose code parts)."""
    from torch._dynamo.guards import get_verbose_code_parts
    from torch._guards import CompileContext
    from torch._library import opaque_object as oo

    value = self.get(guard)
    info = oo.get_opaque_obj_info(type(value))
    guard_fn = getattr(info, "guard_fn", None)
    if guard_fn is None:
        return
    expected = copy.deepcopy(guard_fn(value))

    def opaque_guard_fn_matches(x: Any) -> bool:
        return guard_fn(x) == expected

    name = f"___check_opaque_guard_fn_{id(opaque_guard_fn_matches)}_c{CompileContext.current_compile_id()}"
    self.get_guard_manager(guard).add_lambda_guard(
        opaque_guard_fn_matches, get_verbose_code_parts(name, guard)
    )


POINTS = [
    PatchPoint(
        name="library.MemberType",
        target=f"{_OO}:MemberType",
        build=lambda _original: MemberType,
        new_attribute=True,
        reason="the kinds of opaque members (torch 2.11's enum)",
        series=("0000 torch/_library/opaque_object.py::MemberType",),
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_registered_by_type_and_by_name_cpu",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="library.register_opaque_type",
        target=f"{_OO}:register_opaque_type",
        build=_build_register_opaque_type,
        reason="registration takes guard_fn and members (torch 2.11)",
        series=(
            "0000 torch/_library/opaque_object.py::register_opaque_type",
            "0000 torch/_library/opaque_object.py::_OpaqueTypeInfo",
        ),
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_unregistered_member_clear_error_user_opaque_cpu",
            "test/points/test_value_opaque_attrs.py::TestValueOpaqueAttrs::test_value_type_with_fx_repr_only",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="fx.CodeGen._gen_python_code",
        target="torch.fx.graph:CodeGen._gen_python_code",
        build=_build_gen_python_code,
        reason="a value opaque written for torch 2.11+ (__fx_repr__, no __repr__) "
        "registers and is written into generated code (torch 2.11)",
        series=("0000 torch/fx/graph.py::CodeGen._gen_python_code",),
        guarded_by=(
            "test/points/test_value_opaque_attrs.py::TestValueOpaqueAttrs::test_value_type_with_fx_repr_only",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="library.get_opaque_obj_info",
        target=f"{_OO}:get_opaque_obj_info",
        build=lambda _original: get_opaque_obj_info,
        new_attribute=True,
        reason="look up a registration with its members and guard_fn (torch 2.11)",
        series=("0000 torch/_library/opaque_object.py::get_opaque_obj_info",),
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_registered_by_type_and_by_name_cpu",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="library.get_member_type",
        target=f"{_OO}:get_member_type",
        build=lambda _original: get_member_type,
        new_attribute=True,
        reason="how a member of an opaque is registered, for Dynamo (torch 2.11)",
        series=("0000 torch/_library/opaque_object.py::get_member_type",),
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_member_reads_in_dynamo_cpu",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="guards.GuardBuilder.OPAQUE_OBJ_GUARD_FN_MATCH",
        target="torch._dynamo.guards:GuardBuilder.OPAQUE_OBJ_GUARD_FN_MATCH",
        build=lambda _original: OPAQUE_OBJ_GUARD_FN_MATCH,
        new_attribute=True,
        reason="guard a reference opaque on its guard_fn values (torch 2.11)",
        series=("0000 torch/_dynamo/guards.py::GuardBuilder.OPAQUE_OBJ_GUARD_FN_MATCH",),
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_other_dim_names_recompile_cpu",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="dynamo.TorchScriptObjectVariable.var_getattr",
        target="torch._dynamo.variables.script_object:TorchScriptObjectVariable.var_getattr",
        build=_build_var_getattr,
        reason="Dynamo reads a registered member of a reference opaque (torch 2.11)",
        series=("0000 torch/_dynamo/variables/script_object.py::TorchScriptObjectVariable.var_getattr",),
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_member_reads_in_dynamo_cpu",
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_unregistered_member_in_dynamo_cpu",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="dynamo.TorchScriptObjectVariable.call_method",
        target="torch._dynamo.variables.script_object:TorchScriptObjectVariable.call_method",
        build=_build_call_method,
        reason="Dynamo calls a registered method of a reference opaque (torch 2.11)",
        series=("0000 torch/_dynamo/variables/script_object.py::TorchScriptObjectVariable.call_method",),
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_member_reads_in_dynamo_cpu",
        ),
        **ONLY_2_10,
    ),
]
