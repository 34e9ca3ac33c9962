"""DTensor flattens with its device mesh as an opaque inner attr (opt-in group "dtensor").

Series patch 0014 ("[distributed][dynamo] DTensor flattens with device_mesh
..."), only with ``install(dtensor=True)``.

Releases and modes: 2.11.0 (backport).
Series commits:
    patches/v2.11.0/0014-distributed-dynamo-DTensor-flattens-with-device_mesh.patch.
Upstream: none (not an upstream fix).

Opt-in (``install(dtensor=True)``): DTensor's mesh as an opaque inner attr.

torch 2.13's ``DTensor.__tensor_flatten__`` lists ``device_mesh`` among its
inner attrs (``["_local_tensor", "device_mesh"]``) and keeps only
placements, tensor meta, shard order and ``requires_grad`` in the context;
``__tensor_unflatten__`` rebuilds the spec around the mesh it is handed. So
the mesh is a graph input: one compiled graph serves every equal mesh, and
outputs / grads carry the caller's mesh, not the one seen at compile time
(2.11 keeps the whole ``_spec``, mesh included, in the context).

The points ``distributed.DTensor.__tensor_flatten__``,
``__tensor_unflatten__`` and ``__coerce_same_metadata_as_tangent__`` give
2.11's DTensor the same flatten. They are a group of
their own, applied only by ``install(dtensor=True)``: without them,
``install()`` leaves DTensor exactly as torch 2.11 has it. They need the
DeviceMesh registration of ``points/distributed_opaques.py`` and what plain
``install()`` gives every fake of a mesh there (``isinstance``, equality
and hashing as on 2.13, a mesh input handed to ``DTensor.from_local``); one further
piece lives in ``points/dynamo_opaque_inputs.py`` because its target is already edited
there: ``dynamo.VariableBuilder.wrap_tensor``'s DTensor branch accepts this
flatten's context (:func:`flatten_ctx_ok`).

``x.redistribute(x.device_mesh, placements)`` in the compiled code (the
point ``dynamo.TensorVariable.method_redistribute``): 2.11's
Dynamo (``TensorVariable.method_redistribute``) bakes every argument into
the graph as a Python constant, and the mesh is now a graph input
("TorchScriptObjectVariable(FakeScriptObject) is self-referential"; a
global mesh that is also a DTensor input's mesh is that same input). 2.13
traces ``redistribute`` itself. Here a mesh argument that is an opaque graph
input equal to the tensor's own mesh is dropped (``device_mesh=None``:
redistribute then uses the tensor's mesh, the caller's at run time), which
is what DTensor does with it anyway: it only redistributes within one mesh,
and both meshes are guarded (equal at run time as at compile time).

On torch >= 2.12 DTensor flattens this way itself and ``dtensor=True`` adds
nothing.
"""

from __future__ import annotations

from typing import Any

from ..patching.registry import PatchPoint
from ._versions import ONLY_2_11


#: the point group install(dtensor=True) adds
GROUP = "dtensor"

def _tensor_flatten(self):
    """Replaces ``DTensor.__tensor_flatten__`` (torch 2.11.0) with torch
    2.13's layout: the mesh is an inner attr (a reference opaque, a graph
    input), the context holds the rest of the spec.

    Note [DTensor opaque-mesh flatten]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    The context layout matches 2.13's
    (placements, tensor_meta, shard_order, requires_grad); keep it in sync
    with :func:`_tensor_unflatten` and :func:`flatten_ctx_ok`.
    """
    spec = self._spec
    return ["_local_tensor", "device_mesh"], (
        spec.placements,
        spec.tensor_meta,
        spec.shard_order,
        self.requires_grad,
    )


def _tensor_unflatten(inner_tensors, flatten_spec, outer_size, outer_stride):
    """Replaces ``DTensor.__tensor_unflatten__`` (torch 2.11.0): the spec is
    rebuilt around the mesh passed in ``inner_tensors`` (the caller's mesh at
    run time, its FakeScriptObject while tracing), as torch 2.13 does. See
    Note [DTensor opaque-mesh flatten]."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    if flatten_spec is None:
        raise AssertionError(
            "DTensor.__tensor_unflatten__ got no flatten context; expected the "
            "one DTensor.__tensor_flatten__ returns (install(dtensor=True) layout)"
        )
    placements, tensor_meta, shard_order, requires_grad = flatten_spec
    spec = DTensorSpec(
        inner_tensors["device_mesh"],
        placements,
        tensor_meta=TensorMeta(shape=outer_size, stride=outer_stride, dtype=tensor_meta.dtype),
        shard_order=shard_order,
    )
    return DTensor(inner_tensors["_local_tensor"], spec, requires_grad=requires_grad)


def _coerce_same_metadata_as_tangent(self, flatten_spec, expected_type=None):
    """Replaces ``DTensor.__coerce_same_metadata_as_tangent__`` (torch
    2.11.0), which unpacks 2.11's flatten context ``(spec, requires_grad)``;
    reads the placements from this module's context as torch 2.13 does. See
    Note [DTensor opaque-mesh flatten]."""
    if expected_type is not None:
        return None
    placements = flatten_spec[0]
    return self.redistribute(device_mesh=self.device_mesh, placements=placements)


def flatten_ctx_ok(value: Any, ctx: Any) -> bool:
    """Called from the edited ``VariableBuilder.wrap_tensor`` (its DTensor
    branch, which guards on ``_spec`` and ``requires_grad`` and so checks
    that the context holds nothing else): true for 2.11's context
    ``(_spec, requires_grad)`` and for this module's (see Note [DTensor
    opaque-mesh flatten]), whose mesh is guarded as an opaque input."""
    spec = value._spec
    if len(ctx) == 2:
        return ctx[0] == spec and ctx[1] == value.requires_grad
    return (
        len(ctx) == 4
        and ctx[0] == spec.placements
        and ctx[1] == spec.tensor_meta
        and ctx[2] == spec.shard_order
        and ctx[3] == value.requires_grad
    )


def _unwrap_fake_mesh(obj: Any) -> Any:
    from .distributed_opaques import unwrap_fake

    return unwrap_fake(obj)


def _own_mesh_arg(tensor_vt: Any, mesh_vt: Any) -> bool:
    """Whether ``mesh_vt`` (a redistribute argument) is an opaque graph
    input equal to the mesh of the DTensor ``tensor_vt`` is (at compile
    time; both are guarded, so at run time too)."""
    from torch._dynamo.variables.script_object import TorchScriptObjectVariable
    from torch._library.fake_class_registry import FakeScriptObject

    mesh_vt = mesh_vt.realize()
    if not isinstance(mesh_vt, TorchScriptObjectVariable) or not isinstance(mesh_vt.value, FakeScriptObject):
        return False
    example = tensor_vt.proxy.node.meta.get("example_value")
    own = getattr(example, "device_mesh", None)
    return own is not None and _unwrap_fake_mesh(own) == _unwrap_fake_mesh(mesh_vt.value)


def _build_method_redistribute(original):
    def method_redistribute(self, tx, *args, **kwargs):
        """Wraps ``TensorVariable.method_redistribute`` (torch 2.11.0), which
        turns every argument into a Python constant: a mesh argument that is
        the DTensor's own (opaque, graph-input) mesh becomes ``None``, so the
        traced redistribute uses the tensor's mesh. See the module docstring."""
        from torch._dynamo.variables import ConstantVariable

        if args and _own_mesh_arg(self, args[0]):
            args = (ConstantVariable.create(None), *args[1:])
        elif "device_mesh" in kwargs and _own_mesh_arg(self, kwargs["device_mesh"]):
            kwargs = {**kwargs, "device_mesh": ConstantVariable.create(None)}
        return original(self, tx, *args, **kwargs)

    return method_redistribute


POINTS = [
    PatchPoint(
        name="dynamo.TensorVariable.method_redistribute",
        target="torch._dynamo.variables.tensor:TensorVariable.method_redistribute",
        build=_build_method_redistribute,
        reason="redistribute(x.device_mesh, ...) in compiled code: the opaque mesh input is the tensor's own",
        series=(
            "0014 torch/_dynamo/variables/tensor.py::TensorVariable.method_redistribute",
            "0014 torch/_dynamo/variables/tensor.py::TensorVariable._is_own_opaque_mesh",
        ),
        group=GROUP,
        guarded_by=(
            "test/distributed/test_dtensor_opaque_mesh.py::TestDTensorOpaqueMeshCPU::test_redistribute_own_mesh_aot_eager_cpu",
            "test/distributed/test_dtensor_opaque_mesh.py::TestDTensorOpaqueMeshCPU::test_redistribute_own_mesh_inductor_cpu",
        ),
        **ONLY_2_11,
    ),
    PatchPoint(
        name="distributed.DTensor.__tensor_flatten__",
        target="torch.distributed.tensor._api:DTensor.__tensor_flatten__",
        series=("0014 torch/distributed/tensor/_api.py::DTensor.__tensor_flatten__",),
        build=lambda _original: _tensor_flatten,
        reason="DTensor's mesh is an inner attr (an opaque graph input), as in torch 2.13",
        group=GROUP,
        guarded_by=(
            "test/distributed/test_dtensor_opaque_mesh.py::TestDTensorOpaqueMeshCPU::test_equal_meshes_one_compile_cpu",
        ),
        **ONLY_2_11,
    ),
    PatchPoint(
        name="distributed.DTensor.__tensor_unflatten__",
        target="torch.distributed.tensor._api:DTensor.__tensor_unflatten__",
        series=("0014 torch/distributed/tensor/_api.py::DTensor.__tensor_unflatten__",),
        build=lambda _original: staticmethod(_tensor_unflatten),
        reason="DTensor's spec is rebuilt around the mesh passed at run time, as in torch 2.13",
        group=GROUP,
        guarded_by=(
            "test/distributed/test_dtensor_opaque_mesh.py::TestDTensorOpaqueMeshCPU::test_dtensor_input_fwd_bwd_aot_eager_cpu",
        ),
        **ONLY_2_11,
    ),
    PatchPoint(
        name="distributed.DTensor.__coerce_same_metadata_as_tangent__",
        target="torch.distributed.tensor._api:DTensor.__coerce_same_metadata_as_tangent__",
        series=("0014 torch/distributed/tensor/_api.py::DTensor.__coerce_same_metadata_as_tangent__",),
        build=lambda _original: _coerce_same_metadata_as_tangent,
        reason="a tangent's placements are read from the new flatten context",
        group=GROUP,
        guarded_by=(
            "test/distributed/test_dtensor_opaque_mesh.py::TestDTensorOpaqueMeshCPU::test_dtensor_input_fwd_bwd_aot_eager_cpu",
        ),
        **ONLY_2_11,
    ),
]
