"""DeviceMesh and ProcessGroup as reference opaques.

Series patch 0012 ("[distributed][dynamo] DeviceMesh and ProcessGroup as
reference opaques"), and the fake's identity (``__eq__``: 0014 on 2.11,
0022 on 2.10; ``__hash__``, ``__deepcopy__``, ``__class__``, the proxy
tracer's keys and ``DTensor.from_local`` on a mesh input: 0022).

Releases and modes: 2.10.0, 2.11.0 (backport); 2.10.0, 2.11.0, 2.13.0
    (backport, forced).
Series commits:
    patches/v2.10.0/0000-aot_autograd-dynamo-inductor-Opaque-objects-saved-fo.patch,
    patches/v2.10.0/0012-distributed-dynamo-DeviceMesh-and-ProcessGroup-as-re.patch,
    patches/v2.11.0/0014-distributed-dynamo-DTensor-flattens-with-device_mesh.patch,
    patches/v2.10.0/0022-distributed-dynamo-Fakes-of-a-mesh-answer-as-the-mes.patch.
Upstream: none (not an upstream fix).

``DeviceMesh`` and ``ProcessGroup`` as reference opaques on torch 2.10 / 2.11.

From torch 2.12, ``torch.distributed`` registers both as reference-type
opaques (``_register_distributed_opaque_types`` in
``torch/distributed/device_mesh.py``), so a subclass can list a mesh or a
process group itself among its ``__tensor_flatten__`` attrs: the object is a
graph input, members listed as ``USE_REAL`` are read off the real object at
trace time (baked into the graph, guarded by ``guard_fn``), and outputs /
grads carry the caller's object. On 2.11 neither class can be registered
(``register_opaque_type`` requires the ``OpaqueBaseMeta`` metaclass, which
2.13 gets by deriving ``DeviceMesh`` from ``OpaqueBase`` and by giving the
pybind ``ProcessGroup`` that metaclass in C++), and Dynamo turns every mesh /
process group into a ``DeviceMeshVariable`` / ``ProcessGroupVariable``
constant (2.13 removed both).

The points:

* ``opaque_object._OPAQUE_TYPES`` / ``_OPAQUE_TYPES_BY_NAME``: 2.11's registry
  seen through an overlay that adds the two classes with 2.13's members and
  guard (registering on the registry directly, past the metaclass check; the
  check itself stays for user classes). Writes go to torch's own dicts, so a
  type registered while installed stays registered after ``uninstall()``;
  the two entries of ours go away with the overlay.
* ``OpaqueBaseMeta.__instancecheck__``: ``isinstance(x, OpaqueBase)`` asks the
  registry, as 2.13 does, so a mesh counts as an opaque object (and its
  ``FakeScriptObject`` too) wherever an opaque is recognised.
* ``VariableBuilder._wrap``: a mesh / process group that is an inner attr of
  a subclass input (marked by the ``wrap_tensor`` edit in ``dynamo_opaque_inputs.py``) is
  wrapped as an opaque graph input (2.13's path) instead of 2.11's
  ``DeviceMeshVariable`` (a constant: ``x.mesh`` handed to a custom op
  graph-breaks, it has no proxy) / ``ProcessGroupVariable`` (``ID_MATCH``:
  every new group recompiles). Everywhere else (a global mesh,
  ``DTensor.from_local(x, mesh)``) 2.11's variables stay, so code without
  opaque attrs traces as before.
* ``FakeScriptObject.__getattribute__`` (also in forced mode, torch 2.13 has
  the same message): reading an unregistered member of an opaque while
  tracing names the type, the member and the ``members={...}`` registration
  instead of the generic "Tried to call __getattr__ ... on a FakeScriptObject".

A submesh *derived* in traced code from a mesh input (2.13's
``reconstruct_fn``) is ``derived_submesh.py``.

torch 2.10 takes the same points (its registry, ``_wrap`` and
``FakeScriptObject`` read alike) once ``opaque_members.py`` has given it
2.11's members and ``guard_fn``, with two 2.10 variants: the instance check
is on the package's own ``OpaqueBase`` (2.10 has no ``torch._opaque_base``),
and ``_wrap`` also installs the ``guard_fn`` guard 2.10 lacks. 2.10's
DeviceMesh lacks three of the members 2.13 lists; they are left out there.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, MutableMapping
from typing import Any

from .. import _torch_compat
from ..patching import point_state
from ..patching.registry import PatchPoint
from ..patching.source_edit import Edit, edited_function
from ._versions import ONLY_BACKPORT, per_release, RUNTIME


# Note [Distributed opaque members]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The member lists and the guard are 2.13's (torch/distributed/device_mesh.py,
# _register_distributed_opaque_types). Keep in sync with that function and with
# the series' copies in patches/v2.11.0 and patches/v2.10.0 (0012; 2.10's
# leaves out _NOT_ON_2_10_DEVICE_MESH).
_PROCESS_GROUP_MEMBERS = {
    "size": "USE_REAL",
    "rank": "USE_REAL",
    "_get_backend_name": "USE_REAL",
    "group_name": "USE_REAL",
    "group_desc": "USE_REAL",
    "__eq__": "USE_REAL",
    "__ne__": "USE_REAL",
}
# 2.13's list less "_hash", which 2.11's DeviceMesh does not have
# (maybe_to_fake_obj refuses a registered member the object lacks).
_DEVICE_MESH_MEMBERS = {
    "_flatten_rank_map": "USE_REAL",
    "_layout": "USE_REAL",
    "_device_type": "USE_REAL",
    "_mesh_dim_names": "USE_REAL",
    "_thread_id": "USE_REAL",
    "get_rank": "USE_REAL",
    "size": "USE_REAL",
    "get_coordinate": "USE_REAL",
    "get_local_rank": "USE_REAL",
    "__eq__": "USE_REAL",
    "__ne__": "USE_REAL",
    "ndim": "USE_REAL",
    "shape": "USE_REAL",
    "mesh_dim_names": "USE_REAL",
    "get_group": "INLINED",
    "_pg_registry": "INLINED",
    "_create_flatten_mesh": "USE_REAL",
    "_coordinate_on_dim": "USE_REAL",
    "_dim_group_names": "USE_REAL",
    "_flatten_mapping": "USE_REAL",
    "_rank_map": "USE_REAL",
    "_root_mesh": "USE_REAL",
    "device_type": "USE_REAL",
    "mesh": "USE_REAL",
    "_flatten": "INLINED",
    "_unflatten": "USE_REAL",
    "_is_current_rank_part_of_mesh": "USE_REAL",
    "_sym_get_coordinate": "USE_REAL",
    "_get_mesh_dim_by_name": "USE_REAL",
    "_get_root_mesh": "INLINED",
    "__getitem__": "INLINED",
    "_get_slice_mesh_layout": "INLINED",
    "_create_sub_mesh": "INLINED",
}


def _device_mesh_guard(mesh: Any) -> list[Any]:
    # 2.13's guard_fn: a mesh with other ranks, layout, device type, dim
    # names or creating thread is another graph (equal ones share it).
    return [
        mesh._flatten_rank_map,
        mesh._layout,
        mesh._device_type,
        mesh._mesh_dim_names,
        mesh._thread_id,
    ]


def distributed_opaque_classes() -> dict[type, tuple[dict[str, Any], Any]]:
    """{class: (members, guard_fn)} for the classes 2.13 registers."""
    import torch.distributed as dist

    if not dist.is_available():
        return {}
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.distributed_c10d import ProcessGroup

    member_type = _member_type()
    mesh_members = dict(_DEVICE_MESH_MEMBERS)
    if _torch_compat.torch_version() == "2.10.0":
        for name in _NOT_ON_2_10_DEVICE_MESH:
            del mesh_members[name]
    return {
        ProcessGroup: ({k: member_type[v] for k, v in _PROCESS_GROUP_MEMBERS.items()}, None),
        DeviceMesh: ({k: member_type[v] for k, v in mesh_members.items()}, _device_mesh_guard),
    }


#: members of 2.13's list that torch 2.10's DeviceMesh does not have (its
#: process groups have no registry; no coordinate as a SymInt); a registered
#: member the object lacks is refused when its fake is made
_NOT_ON_2_10_DEVICE_MESH = ("_pg_registry", "_is_current_rank_part_of_mesh", "_sym_get_coordinate")


def _member_type() -> Any:
    # torch 2.11's enum, or on 2.10 the one opaque_members installs there
    from torch._library import opaque_object

    member_type = getattr(opaque_object, "MemberType", None)
    if member_type is None:
        from .opaque_members import MemberType as member_type
    return member_type


class _Overlay(MutableMapping):
    """A registry dict seen with extra entries in front of it.

    Reads find our entries first; writes and deletes of other keys go to
    torch's dict, so registrations made while installed outlive the install.
    """

    def __init__(self, base: MutableMapping, extra: dict) -> None:
        self._base = base
        self._extra = extra

    def __getitem__(self, key):
        try:
            return self._extra[key]
        except (KeyError, TypeError):
            return self._base[key]

    def __contains__(self, key) -> bool:
        try:
            if key in self._extra:
                return True
        except TypeError:
            pass
        return key in self._base

    def __setitem__(self, key, value) -> None:
        if key in self._extra:
            # re-registering DeviceMesh / ProcessGroup by hand: theirs wins
            del self._extra[key]
        self._base[key] = value

    def __delitem__(self, key) -> None:
        if key in self._extra:
            del self._extra[key]
        else:
            del self._base[key]

    def __iter__(self) -> Iterator:
        yield from self._extra
        for k in self._base:
            if k not in self._extra:
                yield k

    def __len__(self) -> int:
        return len(self._extra) + sum(1 for k in self._base if k not in self._extra)


@functools.cache
def _type_infos() -> dict[type, Any]:
    import torch
    from torch._library.opaque_object import _OpaqueTypeInfo

    from .opaque_members import opaque_type_info

    infos = {}
    for cls, (members, guard_fn) in distributed_opaque_classes().items():
        name = f"{cls.__module__}.{cls.__qualname__}"
        if "members" in _OpaqueTypeInfo.__dataclass_fields__:
            # 2.11's info has no reconstruct_fn field (see the module docstring)
            infos[cls] = _OpaqueTypeInfo(name, "reference", guard_fn, members, False)
        else:  # torch 2.10: opaque_members' info with 2.11's fields
            infos[cls] = opaque_type_info(cls, name, "reference", guard_fn, members)
        if not torch._C._is_opaque_type_registered(name):
            # The C++ side only knows names (custom-op schemas may name the
            # type); it cannot be unregistered and needs no undoing: without
            # the Python entry the class is not an opaque type.
            torch._C._register_opaque_type(name)
    return infos


def _build_opaque_types(original):
    """build(): replaces ``torch._library.opaque_object._OPAQUE_TYPES`` (torch
    2.11.0) by an overlay of it that also holds DeviceMesh and ProcessGroup
    with 2.13's members and guard (module docstring). Note [install() is
    transparent without opaques]: delegation (every other key is torch's
    dict's)."""
    return _Overlay(original, dict(_type_infos()))


def _build_opaque_types_by_name(original):
    """build(): the same overlay for ``opaque_object._OPAQUE_TYPES_BY_NAME``
    (torch 2.11.0)."""
    return _Overlay(original, {info.class_name: info for info in _type_infos().values()})


def _build_instancecheck(original):
    def __instancecheck__(cls, instance):
        """Replaces ``torch._opaque_base.OpaqueBaseMeta.__instancecheck__``
        (torch 2.11.0; on 2.10.0 the package's own
        ``torch_subclass_rt._opaque_base.OpaqueBaseMeta.__instancecheck__``,
        Note [OpaqueBase on torch 2.10]) with 2.13's rule for ``OpaqueBase`` itself: an
        instance of any registered opaque type, or a FakeScriptObject of one
        (``DeviceMesh`` / ``ProcessGroup`` do not derive from ``OpaqueBase``
        on 2.11). For a concrete subclass, 2.11's nominal check is kept.
        """
        if cls is _torch_compat.opaque_base():
            return type.__instancecheck__(cls, instance) or (
                _torch_compat.is_registered_opaque_object(instance)
            )
        return original(cls, instance)

    return __instancecheck__


def treat_as_opaque(builder: Any, value: Any) -> bool:
    """Called from the edited ``VariableBuilder._wrap``: wrap this mesh /
    process group as an opaque graph input (set by the edited
    ``wrap_tensor`` for the inner attrs of a subclass input)."""
    return bool(point_state.OPAQUE_ATTR_BUILDERS.get(builder, False)) and (
        _torch_compat.is_reference_opaque_type(type(value))
    )


def _build_wrap(original):
    """``torch._dynamo.variables.builder.VariableBuilder._wrap`` (torch
    2.11.0) with two edits. Differs from 2.11: a mesh / process group that
    is an inner attr of a subclass input is wrapped as an opaque graph
    input (2.13's path) instead of a DeviceMeshVariable /
    ProcessGroupVariable. Note [install() is transparent without opaques]:
    identical (torch's own source; only an inner attr marked by the
    ``wrap_tensor`` edit, i.e. an opaque, takes the new path)."""
    return edited_function(original, _WRAP_EDITS)


_WRAP_EDITS = [
    Edit(
        """
        elif ProcessGroupVariable.is_process_group(value):
        """,
        """
        elif ProcessGroupVariable.is_process_group(value) and not (
            __tsrt__.treat_as_opaque(self, value)
        ):
        """,
    ),
    Edit(
        """
        elif DeviceMeshVariable.is_device_mesh(value):
        """,
        """
        elif DeviceMeshVariable.is_device_mesh(value) and not (
            __tsrt__.treat_as_opaque(self, value)
        ):
        """,
    ),
]


#: torch 2.10: a reference opaque input is also guarded on its guard_fn
#: (opaque_members.OPAQUE_OBJ_GUARD_FN_MATCH; torch 2.11 does it already)
_GUARD_FN_EDIT_2_10 = Edit(
    """
    # Reference-type: guard only on type/identity
    self.install_guards(GuardBuilder.TYPE_MATCH)
    """,
    """
    # Reference-type: guard on type, and on what its guard_fn returns
    self.install_guards(GuardBuilder.TYPE_MATCH)
    self.install_guards(GuardBuilder.OPAQUE_OBJ_GUARD_FN_MATCH)
    """,
)


def _build_wrap_2_10(original):
    """``VariableBuilder._wrap`` (torch 2.10.0): 2.11's two edits of
    :func:`_build_wrap`, which match 2.10's source, and one more. Differs
    from 2.10, as 2.11: a reference opaque graph input is guarded on its
    type's ``guard_fn`` too (2.10 guards its type only). Note [install() is
    transparent without opaques]: identical (the new guard is installed
    only for a registered reference opaque, and does nothing for a type
    registered without guard_fn)."""
    return edited_function(original, [*_WRAP_EDITS, _GUARD_FN_EDIT_2_10])


def unregistered_member_error(fake: Any, name: str) -> AttributeError | None:
    """The error for reading member ``name`` of an opaque's FakeScriptObject
    that its registration does not list (None: not an opaque, or a name
    FakeScriptObject machinery probes)."""
    from torch._library.opaque_object import get_opaque_obj_info

    if name.startswith("__") and name.endswith("__"):
        return None  # hasattr probes (__fx_repr__, __obj_flatten__, ...)
    real = object.__getattribute__(fake, "__dict__").get("real_obj")
    if real is None:
        return None
    info = get_opaque_obj_info(type(real))
    if info is None:
        return None
    from ..runtime import errors

    return errors.unregistered_opaque_member_error(type(real), name, sorted(getattr(info, "members", {})))


#: torch's FakeScriptObject.__getattribute__, set when the point is built.
#: A module global, not a closure cell: Dynamo guards on a traced
#: __getattribute__'s closure through the *real* object's source, which has
#: no such function (CLOSURE_MATCH on L['x'].mesh.__getattribute__.__func__).
_torch_fake_getattribute: Any = None


def _fake_getattribute(self, name):
    """Wraps ``FakeScriptObject.__getattribute__`` (torch 2.10.0 / 2.11.0 /
    2.13.0).

    Differs in two ways. The message for an opaque's unregistered member
    names the opaque type and the member and shows the ``members={...}``
    registration (2.11/2.13 say "Tried to call __getattr__ ... on a
    FakeScriptObject"); still an ``AttributeError``, so ``hasattr`` and
    ``getattr(obj, name, default)`` behave as before. And a fake of a
    ``DeviceMesh`` / ``ProcessGroup`` answers ``__class__`` with its real
    object's class (:func:`fake_class`).
    """
    if name == "__class__":
        cls = fake_class(self)
        if cls is not None:
            return cls
    try:
        return _torch_fake_getattribute(self, name)
    except AttributeError as e:
        better = unregistered_member_error(self, name)
        if better is None:
            raise
        raise better from e.__cause__


def fake_class(fake: Any) -> type | None:
    """The class a FakeScriptObject reports as its ``__class__``: its real
    object's, for a DeviceMesh / ProcessGroup; None (FakeScriptObject's
    own) for anything else.

    Note [isinstance of a fake DeviceMesh]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    Torch 2.13's ``DeviceMesh``
    derives from ``OpaqueBase`` and its ``ProcessGroup`` has that metaclass,
    whose ``__instancecheck__`` is true for a FakeScriptObject of an
    instance, so library code that checks ``isinstance(mesh, DeviceMesh)``
    (DTensor's sharding propagation, functional collectives'
    ``(mesh, dim)`` groups, ``DeviceMesh.__eq__``, ``_collective_utils``)
    accepts the fake a traced subclass carries. 2.10/2.11's classes have
    plain ``type`` / pybind metaclasses, which cannot be swapped; but
    ``isinstance`` falls back to ``obj.__class__`` when ``type(obj)`` does
    not match, so the fake reports its real object's class there.
    ``type(fake)`` stays FakeScriptObject (Dynamo's and FakeScriptObject's
    own checks use it, and ``istype``), and so does every other fake (a
    user's opaque gets the same answer from OpaqueBaseMeta, a torchbind
    object's fake is no instance of its class on 2.13 either).
    """
    real = object.__getattribute__(fake, "__dict__").get("real_obj")
    if real is None:
        return None
    cls = type(real)
    return cls if cls in _classes_reported_by_fakes() else None


@functools.cache
def _classes_reported_by_fakes() -> frozenset[type]:
    # torch >= 2.12 (forced mode) answers isinstance through the metaclass
    if _torch_compat.torch_version() not in _torch_compat.BACKPORT_VERSIONS:
        return frozenset()
    return frozenset(distributed_opaque_classes())


def _build_getattribute(original):
    """build(): replaces ``FakeScriptObject.__getattribute__`` (torch 2.11.0
    backport, 2.13.0 forced) by :func:`_fake_getattribute`, keeping the
    original to delegate to."""
    global _torch_fake_getattribute
    _torch_fake_getattribute = original
    return _fake_getattribute


def unwrap_fake(obj: Any) -> Any:
    from torch._library.fake_class_registry import FakeScriptObject

    if isinstance(obj, FakeScriptObject):
        real = object.__getattribute__(obj, "__dict__").get("real_obj")
        if real is not None:
            return real
    return obj


def _fake_eq(self, other):
    """Added as ``FakeScriptObject.__eq__`` (torch 2.10.0 / 2.11.0 have
    none: identity), as torch 2.13 has it: two fakes of one object, or a
    fake and its object, are equal; otherwise the real objects compare
    (``!=`` follows, Python derives ``__ne__``). A traced DTensor's
    redistribute compares its (fake) mesh with the target's, its backward
    the forward's fake mesh with the tangent's (another fake of the same
    mesh), a sharded subclass's pointwise op its inputs' meshes; 2.11's
    identity made these "Cross device mesh comm not supported yet!" /
    "Could not run pointwise computation across different mesh". A fake
    without a real object compares by identity."""
    from torch._library.fake_class_registry import FakeScriptObject

    if self is other:
        return True
    real, other_real = unwrap_fake(self), unwrap_fake(other)
    if isinstance(real, FakeScriptObject) or isinstance(other_real, FakeScriptObject):
        return False
    return real == other_real


def _fake_hash(self):
    """Added as ``FakeScriptObject.__hash__`` (torch 2.10.0 / 2.11.0:
    identity), as torch 2.13 has it: its real object's hash (identity for
    an unhashable one, or a fake without a real object), so that fakes of
    one object, equal by :func:`_fake_eq`, hash alike (DTensorSpec and
    sharding propagation's caches hash the mesh). 2.11's proxy tracer,
    which kept FakeScriptObjects by that hash, keys them by identity
    instead (:func:`_build_weak_hash_ref`)."""
    real = object.__getattribute__(self, "__dict__").get("real_obj")
    if real is None:
        return id(self)
    try:
        return hash(real)
    except TypeError:
        return id(real)


def _fake_deepcopy(self, memo):
    """Added as ``FakeScriptObject.__deepcopy__`` (torch 2.10.0 / 2.11.0
    have none: the default copies the fake's ``__dict__``), as torch 2.13
    has it: the copy's real object is a deep copy of this one's (with
    tracing modes off), and the members set on the fake are read again off
    that copy. The default deep-copied the member values themselves, and a
    mesh's ``_pg_registry`` holds ProcessGroups ("cannot pickle
    'torch._C._distributed_c10d.ProcessGroup' object"), e.g. when a graph
    module whose metadata holds a fake mesh is deep-copied."""
    import copy

    from torch._library.fake_class_registry import FakeScriptMethod, FakeScriptObject
    from torch.utils._python_dispatch import _disable_current_modes

    if id(self) in memo:
        return memo[id(self)]
    get = functools.partial(object.__getattribute__, self)
    new = FakeScriptObject.__new__(FakeScriptObject)
    memo[id(self)] = new
    object.__setattr__(new, "wrapped_obj", copy.deepcopy(get("wrapped_obj"), memo))
    object.__setattr__(new, "script_class_name", get("script_class_name"))
    with _disable_current_modes():
        new_real = copy.deepcopy(get("real_obj"), memo)
        object.__setattr__(new, "real_obj", new_real)
        for name, value in get("__dict__").items():
            if name in ("wrapped_obj", "script_class_name", "real_obj"):
                continue
            if isinstance(value, FakeScriptMethod):
                value = FakeScriptMethod(new, value.method_name, value.schema)
            elif hasattr(new_real, name):
                value = getattr(new_real, name)
            object.__setattr__(new, name, value)
    return new


def _build_weak_hash_ref(original):
    """Replaces ``torch.utils.weak._WeakHashRef`` (torch 2.10.0 / 2.11.0;
    its only user is the key type of the proxy tracer's
    ``script_object_tracker``) by a subclass that keys a FakeScriptObject
    by identity. Differs from 2.11 only for fakes, which :func:`_fake_hash`
    now hashes as their real object: two fakes of one opaque (two inputs
    sharing it, a forward's and a tangent's) must stay two graph inputs,
    as torch 2.13 keeps them (its ``opaque_tracker`` is by id)."""

    class _WeakHashRefIdForFakes(original):
        __slots__ = ()

        def __init__(self, key, callback=None) -> None:
            super().__init__(key, callback)
            from torch._library.fake_class_registry import FakeScriptObject

            if isinstance(key, FakeScriptObject):
                self._id = id(key)

        def __eq__(self, other):
            from torch._library.fake_class_registry import FakeScriptObject

            a, b = self(), other()
            if isinstance(a, FakeScriptObject) or isinstance(b, FakeScriptObject):
                return a is b if a is not None and b is not None else self is other
            return super().__eq__(other)

        __hash__ = original.__hash__

    _WeakHashRefIdForFakes.__qualname__ = _WeakHashRefIdForFakes.__name__ = "_WeakHashRef"
    return _WeakHashRefIdForFakes


def _from_local_mesh_vt(args, kwargs):
    """The mesh argument of a traced ``DTensor.from_local`` call when it is
    an opaque graph input (a subclass's mesh attr), else None."""
    from torch._dynamo.variables.script_object import TorchScriptObjectVariable
    from torch._library.fake_class_registry import FakeScriptObject

    vt = args[1] if len(args) >= 2 else kwargs.get("device_mesh")
    if vt is None:
        return None
    vt = vt.realize()
    if isinstance(vt, TorchScriptObjectVariable) and isinstance(vt.value, FakeScriptObject):
        return vt
    return None


def _from_local_opaque_mesh(self, tx, args, kwargs):
    # DTensor.from_local(x, mesh, placements, ...) with the mesh a graph
    # input: one graph node whose inputs are x and the mesh (the rest are
    # constants, as 2.11's handler makes them), so the output DTensor is on
    # the mesh passed at run time
    from torch._dynamo.utils import proxy_args_kwargs
    from torch._dynamo.variables import ConstantVariable, UserDefinedObjectVariable
    from torch._dynamo.variables.builder import SourcelessBuilder, wrap_fx_proxy

    args, kwargs = list(args), dict(kwargs)
    mesh_vt = args.pop(1) if len(args) >= 2 else kwargs.pop("device_mesh")
    placements_key = 1 if len(args) >= 2 else "placements"
    placements_vt = args[1] if len(args) >= 2 else kwargs.get("placements")
    if placements_vt is None:
        placements_vt = ConstantVariable.create(None)
    elif isinstance(placements_vt, UserDefinedObjectVariable):
        placements_vt = SourcelessBuilder.create(tx, tuple).call_function(tx, [placements_vt], {})
    if placements_key == 1:
        args[1] = placements_vt
    else:
        kwargs["placements"] = placements_vt
    rest = [a.as_python_constant() for a in args[1:]]
    constant_kwargs = {k: v.as_python_constant() for k, v in kwargs.items() if k not in ("shape", "stride")}
    proxied_kwargs = {k: kwargs[k] for k in ("shape", "stride") if k in kwargs}
    from_local = self.value

    def fn_with_prim_types(x, device_mesh, shape=None, stride=None):
        return from_local(x, device_mesh, *rest, **constant_kwargs, shape=shape, stride=stride)

    fn_with_prim_types.__name__ = "prim from_local"
    return wrap_fx_proxy(
        tx=tx,
        proxy=tx.output.create_proxy(
            "call_function", fn_with_prim_types, *proxy_args_kwargs([args[0], mesh_vt], proxied_kwargs)
        ),
    )


def _build_torch_call_function(original):
    def call_function(self, tx, args, kwargs):
        """Wraps ``TorchInGraphFunctionVariable.call_function`` (torch
        2.10.0 / 2.11.0). Differs for ``DTensor.from_local`` with a mesh
        that is an opaque graph input (a subclass's mesh attr, DTensor's
        own under ``install(dtensor=True)``): 2.11's handler bakes every
        argument into the graph as a constant, which such a mesh cannot be
        ("TorchScriptObjectVariable(FakeScriptObject) is
        self-referential"); here the mesh is an input of the traced call,
        as 2.13, which traces ``from_local`` itself, has it. Every other
        call is 2.11's."""
        if _is_from_local(self.value):
            if _from_local_mesh_vt(args, kwargs) is not None:
                return _from_local_opaque_mesh(self, tx, args, kwargs)
        return original(self, tx, args, kwargs)

    return call_function


def _is_from_local(fn: Any) -> bool:
    import torch.distributed as dist

    if not dist.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return fn is DTensor.from_local


POINTS = [
    PatchPoint(
        name="library._OPAQUE_TYPES",
        target="torch._library.opaque_object:_OPAQUE_TYPES",
        # the series registers both classes when torch.distributed.tensor is
        # imported, past register_opaque_type's metaclass check
        series=(
            "0012 torch/distributed/device_mesh.py::_register_distributed_opaque_types",
            "0012 torch/distributed/device_mesh.py::_distributed_opaque_types_registered",
            "0012 torch/distributed/device_mesh.py::_DEVICE_MESH_MEMBERS",
            "0012 torch/distributed/device_mesh.py::_PROCESS_GROUP_MEMBERS",
            "0012 torch/distributed/device_mesh.py::_device_mesh_guard_fn",
            "0012 torch/distributed/tensor/_api.py::<module>",
            "0012 torch/_library/opaque_object.py::_register_opaque_type_info",
            "0012 torch/_library/opaque_object.py::register_opaque_type",
        ),
        build=_build_opaque_types,
        reason="register DeviceMesh / ProcessGroup as reference opaques (2.13's members and guard)",
        # infer_schema maps an annotation to its opaque type name through it
        rebinds=("torch._library.infer_schema",),
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_device_mesh_in_attrs_aot_eager_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="library._OPAQUE_TYPES_BY_NAME",
        target="torch._library.opaque_object:_OPAQUE_TYPES_BY_NAME",
        series=("0012 torch/_library/opaque_object.py::_register_opaque_type_info",),
        build=_build_opaque_types_by_name,
        reason="the same registration, looked up by type name (custom-op schemas, Dynamo)",
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_registered_by_type_and_by_name_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    *per_release(
        name="library.OpaqueBaseMeta.__instancecheck__",
        series=("0012 torch/_opaque_base.py::OpaqueBaseMeta.__instancecheck__",),
        build=_build_instancecheck,
        reason="isinstance(x, OpaqueBase) asks the registry (2.13), so a DeviceMesh is an opaque object",
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_device_mesh_in_attrs_aot_eager_cpu",
        ),
        v2_11=dict(target="torch._opaque_base:OpaqueBaseMeta.__instancecheck__"),
        # 2.10 has no torch._opaque_base (the series' patch 0000 adds it):
        # the same rule on the package's own OpaqueBase
        v2_10=dict(target="torch_subclass_rt._opaque_base:OpaqueBaseMeta.__instancecheck__"),
    ),
    PatchPoint(
        name="library.FakeScriptObject.__getattribute__",
        target="torch._library.fake_class_registry:FakeScriptObject.__getattribute__",
        series=(
            "0012 torch/_library/fake_class_registry.py::FakeScriptObject.__getattribute__",
            "0012 torch/_library/opaque_object.py::unregistered_opaque_member_error",
            # a fake DeviceMesh / ProcessGroup's __class__ (Note [isinstance
            # of a fake DeviceMesh])
            "0022 torch/_library/fake_class_registry.py::FakeScriptObject.__getattribute__",
            "0022 torch/_library/fake_class_registry.py::_classes_reported_by_fakes",
            "0022 torch/distributed/device_mesh.py::_register_distributed_opaque_types",
        ),
        build=_build_getattribute,
        reason="an unregistered member read while tracing names the type, member and members={...}",
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_unregistered_member_clear_error_cpu",
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_unregistered_member_clear_error_user_opaque_cpu",
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_fake_mesh_isinstance_cpu",
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_fake_mesh_as_collective_group_cpu",
        ),
        **RUNTIME,
    ),
    # fakes of one object compare equal and hash alike (torch 2.13)
    *per_release(
        name="library.FakeScriptObject.__eq__",
        target="torch._library.fake_class_registry:FakeScriptObject.__eq__",
        build=lambda _original: _fake_eq,
        reason="fakes of one object compare equal and hash alike (torch 2.13)",
        new_attribute=True,
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_fakes_of_one_object_equal_cpu",
            "test/distributed/test_dtensor_scenarios.py::test_scenario[tp_mlp-aot_eager]",
        ),
        # 2.11's series has it from DTensor's change (0014), which the
        # v2.10.0 series leaves out: there 0022 adds it with the hash
        v2_11=dict(
            series=(
                "0014 torch/_library/fake_class_registry.py::FakeScriptObject.__eq__",
                "0014 torch/_library/fake_class_registry.py::maybe_unwrap_fake_script_object",
            ),
        ),
        v2_10=dict(
            series=(
                "0022 torch/_library/fake_class_registry.py::FakeScriptObject.__eq__",
                "0022 torch/_library/fake_class_registry.py::maybe_unwrap_fake_script_object",
            ),
        ),
    ),
    # __hash__: torch 2.11's class has object's (not its own attribute)
    PatchPoint(
        name="library.FakeScriptObject.__hash__",
        target="torch._library.fake_class_registry:FakeScriptObject.__hash__",
        build=lambda _original: _fake_hash,
        reason="fakes of one object compare equal and hash alike (torch 2.13)",
        new_attribute=True,
        series=("0022 torch/_library/fake_class_registry.py::FakeScriptObject.__hash__",),
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_fakes_of_one_object_equal_cpu",
            "test/distributed/test_dtensor_scenarios.py::test_scenario[tp_mlp-aot_eager]",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="library.FakeScriptObject.__deepcopy__",
        target="torch._library.fake_class_registry:FakeScriptObject.__deepcopy__",
        build=lambda _original: _fake_deepcopy,
        reason="a deep copy of a fake re-reads its members off a copy of its object (torch 2.13)",
        new_attribute=True,
        series=("0022 torch/_library/fake_class_registry.py::FakeScriptObject.__deepcopy__",),
        guarded_by=("test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_fake_mesh_deepcopy_cpu",),
        **ONLY_BACKPORT,
    ),
    *per_release(
        name="dynamo.VariableBuilder._wrap",
        target="torch._dynamo.variables.builder:VariableBuilder._wrap",
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_mesh_attr_into_custom_op_is_runtime_mesh_cpu",
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_process_group_in_attrs_aot_eager_cpu",
        ),
        # Note [State between points]: the builders it reads are marked by
        # dynamo.VariableBuilder.wrap_tensor's edit
        requires=("dynamo.VariableBuilder.wrap_tensor",),
        v2_11=dict(
            build=_build_wrap,
            reason="a mesh / process group inner attr is an opaque graph input, not a DeviceMeshVariable constant",
            series=(
                "0012 torch/_dynamo/variables/builder.py::VariableBuilder._wrap",
                "0012 torch/_dynamo/variables/builder.py::VariableBuilder._is_opaque_inner_attr",
                "0012 torch/_dynamo/variables/builder.py::VariableBuilder.__init__",
            ),
        ),
        v2_10=dict(
            build=_build_wrap_2_10,
            reason="2.11's edits, and a reference opaque input guarded on its guard_fn (torch 2.11)",
            series=(
                "0000 torch/_dynamo/variables/builder.py::VariableBuilder._wrap",
                "0012 torch/_dynamo/variables/builder.py::VariableBuilder._wrap",
                "0012 torch/_dynamo/variables/builder.py::VariableBuilder._is_opaque_inner_attr",
                "0012 torch/_dynamo/variables/builder.py::VariableBuilder.__init__",
            ),
        ),
    ),
    PatchPoint(
        name="dynamo.TorchInGraphFunctionVariable.call_function",
        target="torch._dynamo.variables.torch:TorchInGraphFunctionVariable.call_function",
        build=_build_torch_call_function,
        reason="DTensor.from_local(x, mesh) with an opaque mesh input: the mesh is a graph input",
        series=("0022 torch/_dynamo/variables/torch.py::TorchInGraphFunctionVariable._get_handlers",),
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_from_local_on_mesh_attr_cpu",
            "test/distributed/test_dtensor_scenarios.py::test_scenario[from_local_to_local-aot_eager]",
            "test/distributed/test_dtensor_scenarios.py::test_scenario[tp_mlp-aot_eager]",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="utils.weak._WeakHashRef",
        target="torch.utils.weak:_WeakHashRef",
        # its one user: the proxy tracer's script_object_tracker
        rebinds=("torch.fx.experimental.proxy_tensor",),
        build=_build_weak_hash_ref,
        reason="the proxy tracer keeps fakes by identity now that they hash as their object",
        # the series gives the tracer a ref type of its own instead of
        # changing torch.utils.weak's, whose one user the tracer is
        series=(
            "0022 torch/fx/experimental/proxy_tensor.py::_ScriptObjectRef",
            "0022 torch/fx/experimental/proxy_tensor.py::_ScriptObjectRef.__init__",
            "0022 torch/fx/experimental/proxy_tensor.py::_ScriptObjectRef.__eq__",
            "0022 torch/fx/experimental/proxy_tensor.py::PythonKeyTracer.__init__",
            "0022 torch/fx/experimental/proxy_tensor.py::_GraphAppendingTracerEx.__init__",
        ),
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_fakes_of_one_object_tracked_apart_cpu",
        ),
        **ONLY_BACKPORT,
    ),
]
