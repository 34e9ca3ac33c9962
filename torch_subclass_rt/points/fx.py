"""Proxy tracing and symbolic shapes (``torch.fx.experimental``:
``proxy_tensor``, ``symbolic_shapes``).

``ShapeEnv.produce_guards_verbose``: for a subclass input, 2.11 pairs every
``__tensor_flatten__`` attr with its inner symbolic context
(``context.inner_contexts[attr]``) to guard its sizes and strides. Opaque
attrs have no sizes and no symbolic context (Dynamo's ``_automatic_dynamic``
does not create one for them, as in 2.12), so the lookup raised
``KeyError``. torch 2.12 skips them in that loop; so do we, with a one-line
source edit of the 818-line method.

See Note [One module per torch subsystem] in ``points/__init__.py``.
"""

from __future__ import annotations

from ..patching.registry import PatchPoint
from ..patching.source_edit import Edit, edited_function
from ._versions import ONLY_2_10, ONLY_2_11, ONLY_BACKPORT
from . import _derived_submesh, _torch_2_11_base, _tracing


def _build_produce_guards_verbose(original):
    """``torch.fx.experimental.symbolic_shapes.ShapeEnv.produce_guards_verbose``
    (torch 2.11.0) with one edit. Differs from 2.11, as 2.12: opaque attrs of
    a subclass input are skipped when guarding inner sizes and strides (they
    have neither, nor a symbolic context). Note [install() is transparent
    without opaques]: identical (torch's own source; without opaques no attr
    is skipped)."""
    return edited_function(
        original,
        [
            Edit(
                """
                for attr in attrs:
                    inner_t = getattr(t, attr)
                    inner_context = context.inner_contexts[attr]
                """,
                """
                for attr in attrs:
                    inner_t = getattr(t, attr)
                    if __tsrt__.is_opaque_attr(inner_t):
                        continue  # no sizes/strides to guard (torch 2.12)
                    inner_context = context.inner_contexts[attr]
                """,
            ),
        ],
    )


POINTS = [
    PatchPoint(
        name="fx._iterate_exprs",
        target="torch.fx.experimental.symbolic_shapes:_iterate_exprs",
        build=_torch_2_11_base._build_iterate_exprs,
        reason="'cannot extract sympy expressions' from a saved opaque",
        series=(
            "0000 torch/fx/experimental/symbolic_shapes.py::_iterate_exprs",
        ),
        guarded_by=(_torch_2_11_base._BACKWARD_TEST,),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="fx.set_proxy_slot",
        target="torch.fx.experimental.proxy_tensor:set_proxy_slot",
        build=_tracing._wrap_set_proxy_slot,
        reason="wrappers of one real opaque share one proxy (one graph input)",
        series=(
            "0001 torch/fx/experimental/proxy_tensor.py::set_proxy_slot",
            "0001 torch/fx/experimental/proxy_tensor.py::_registered_opaque_real_obj",
        ),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_shared_opaque_backward_cpu",
            "test/runtime/test_opaque_subclass_parity.py::TestOpaqueSubclassParityCPU::test_tangent_primal_proxy_collision_for_opaque_inner_attr_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="fx.get_proxy_slot",
        target="torch.fx.experimental.proxy_tensor:get_proxy_slot",
        build=_tracing._wrap_get_proxy_slot,
        reason="find the proxy of a fresh wrapper of an already-traced opaque",
        series=(
            "0001 torch/fx/experimental/proxy_tensor.py::get_proxy_slot",
            "0001 torch/fx/experimental/proxy_tensor.py::_registered_opaque_real_obj",
        ),
        rebinds=("torch._higher_order_ops.executorch_call_delegate", "torch.export._trace"),
        guarded_by=(
            "test/points/test_point_guards.py::TestPointGuards::test_dispatch_attached_handle_is_the_handle",
            "test/runtime/test_opaque_subclass_parity.py::TestOpaqueSubclassParityCPU::test_tangent_primal_proxy_collision_for_opaque_inner_attr_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="fx.wrap_key",
        target="torch.fx.experimental.proxy_tensor:wrap_key",
        build=_tracing._wrap_wrap_key,
        reason="a traced function's real opaque output is its graph input, not a constant (2.13)",
        series_none="not yet ported into patches/v2.11.0 (tools/series_map.py NOT_YET_IN_SERIES_POINTS)",
        guarded_by=(
            "test/distributed/test_dtensor_opaque_mesh.py::TestDTensorOpaqueMeshCPU::test_aot_over_dynamo_mesh_output_cpu",
        ),
        **ONLY_2_11,
    ),
    PatchPoint(
        name="fx.ShapeEnv.produce_guards_verbose",
        target="torch.fx.experimental.symbolic_shapes:ShapeEnv.produce_guards_verbose",
        build=_build_produce_guards_verbose,
        reason="KeyError on context.inner_contexts[attr] for an opaque attr",
        series=("0002 torch/fx/experimental/symbolic_shapes.py::ShapeEnv.produce_guards_verbose",),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="fx.PythonKeyTracer.create_arg",
        target="torch.fx.experimental.proxy_tensor:PythonKeyTracer.create_arg",
        build=_derived_submesh._build_create_arg,
        reason="a submesh derived in traced code is derived from the mesh input (2.13's reconstruct_fn)",
        series=(
            "0016 torch/fx/experimental/proxy_tensor.py::PythonKeyTracer.create_arg",
            "0016 torch/fx/experimental/proxy_tensor.py::PythonKeyTracer._try_reconstruct_opaque",
            "0016 torch/_library/opaque_object.py::get_reconstruct_fn",
            "0016 torch/_library/opaque_object.py::_OpaqueTypeInfo",
            "0016 torch/_library/opaque_object.py::_register_opaque_type_info",
            "0016 torch/distributed/device_mesh.py::_device_mesh_reconstruct_fn",
            "0016 torch/distributed/device_mesh.py::_register_distributed_opaque_types",
            "0016 torch/distributed/_ops/device_mesh.py::<module>",
            "0016 torch/distributed/_ops/device_mesh.py::_DEVICE_MESH_TYPE",
            "0016 torch/distributed/_ops/device_mesh.py::_get_submesh_impl",
        ),
        guarded_by=(
            "test/distributed/test_device_mesh_derived_submesh.py::TestDerivedSubmesh::test_submesh_derived_in_dynamo",
            "test/distributed/test_device_mesh_derived_submesh.py::TestDerivedSubmesh::test_submesh_derived_in_dispatch",
        ),
        **ONLY_BACKPORT,
    ),
]
