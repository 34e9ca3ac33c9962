"""AOTAutograd: install our subclass runtime (``runtime/``) into torch.

Backport (2.11): torch has no OpaqueMeta and its subclass utilities assume
every inner attr is a tensor. Forced (2.13): the same functions exist with
native opaque support; we replace them with ours so the whole suite runs
against our implementation. The ``OpaqueMeta`` marker itself is torch's own
class there (see ``runtime/meta.py``), so nothing needs replacing for it.

Only the functions whose 2.11 version mishandles an opaque are replaced on
2.11 (tools/ablate_points.py checks that dropping each one fails a test).
2.11's ``create_subclass_meta``, ``runtime_unwrap_tensor_subclasses``,
``wrap_tensor_subclasses``, ``get_subclass_typing_container`` and
``process_runtime_tangent`` already treat a non-tensor attr as one flat leaf
(or call our ``create_subclass_metadata`` / ``creation_fn`` through their
module global), and ``compute_outer_size_and_stride`` is only called by the
``creation_fn`` we replace.
"""

from __future__ import annotations

from ..patching.registry import PatchPoint
from ..runtime import call_wrapper, flatten, grad_codegen, meta, tangents, wrap
from ._versions import ONLY_BACKPORT, ONLY_FORCED, RUNTIME


def _ours(obj):
    return lambda _original: obj


POINTS = [
    PatchPoint(
        name="aot.OpaqueMeta",
        target="torch._functorch._aot_autograd.schemas:OpaqueMeta",
        build=_ours(meta.OpaqueMeta),
        reason="marker for an opaque slot in SubclassCreationMeta.attrs (new in 2.12)",
        new_attribute=True,
        series=("0001 torch/_functorch/_aot_autograd/schemas.py::OpaqueMeta",),
        guarded_by=(
            "test/test_point_guards.py::TestPointGuards::test_opaque_meta_defined_in_schemas",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="aot.OpaqueMeta.reexport",
        target="torch._functorch.aot_autograd:OpaqueMeta",
        build=_ours(meta.OpaqueMeta),
        reason="2.12 re-exports OpaqueMeta from torch._functorch.aot_autograd",
        new_attribute=True,
        series=("0001 torch/_functorch/aot_autograd.py::<imports>",),
        guarded_by=("test/test_point_guards.py::TestPointGuards::test_opaque_meta_reexported",),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="aot.SubclassCreationMeta.creation_fn",
        target="torch._functorch._aot_autograd.schemas:SubclassCreationMeta.creation_fn",
        build=_ours(wrap.creation_fn),
        reason="rebuild subclasses with the opaque found in the flat args",
        # its run-time plan places outer sizes and strides itself (the
        # series fixes compute_outer_size_and_stride, which only it calls)
        series=(
            "0001 torch/_functorch/_aot_autograd/schemas.py::SubclassCreationMeta.creation_fn",
            "0001 torch/_functorch/_aot_autograd/schemas.py"
            "::SubclassCreationMeta.compute_outer_size_and_stride",
        ),
        guarded_by=(
            "test/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
            "test/test_point_guards.py::TestOurRuntimeRuns::test_runs_our_creation_fn",
        ),
        **RUNTIME,
    ),
    PatchPoint(
        name="aot.create_subclass_metadata",
        target="torch._functorch._aot_autograd.subclass_utils:create_subclass_metadata",
        build=_ours(flatten.create_subclass_metadata),
        reason="OpaqueMeta for reference opaques; clear errors for anything else",
        series=(
            "0001 torch/_functorch/_aot_autograd/subclass_utils.py::create_subclass_metadata",
            "0001 torch/_library/opaque_object.py::classify_tensor_flatten_attr",
            "0001 torch/_library/opaque_object.py::value_opaque_in_tensor_attrs_error",
            "0001 torch/_library/opaque_object.py::unregistered_object_in_tensor_attrs_error",
        ),
        guarded_by=(
            "test/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
            "test/test_point_guards.py::TestOurRuntimeRuns::test_runs_our_create_subclass_metadata",
        ),
        **RUNTIME,
    ),
    PatchPoint(
        name="aot.unwrap_tensor_subclasses",
        target="torch._functorch._aot_autograd.subclass_utils:unwrap_tensor_subclasses",
        build=_ours(flatten.unwrap_tensor_subclasses),
        reason="opaques must enter the trace as FakeScriptObjects (graph inputs), "
        "else the graph returns the compile-time object",
        rebinds=(
            "torch._functorch.aot_autograd",
            "torch._functorch._aot_autograd.graph_capture_wrappers",
        ),
        series=("0001 torch/_functorch/_aot_autograd/subclass_utils.py::unwrap_tensor_subclasses",),
        guarded_by=(
            "test/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_no_stale_compile_time_opaque_canary_cpu",
            "test/test_point_guards.py::TestOurRuntimeRuns::test_runs_our_unwrap_tensor_subclasses",
        ),
        **RUNTIME,
    ),
    PatchPoint(
        name="aot.AOTDispatchSubclassWrapper.post_compile",
        target="torch._functorch._aot_autograd.runtime_wrappers"
        ":AOTDispatchSubclassWrapper.post_compile",
        build=call_wrapper.post_compile,
        reason="per-call unwrap/wrap decided once per compiled function "
        "(2.13 generates this wrapper's source)",
        # benchmarks/overhead.py --subclass mesh on 2.11 (README "Overhead")
        speed_only="per-call overhead ratio 1.35 (2.11's loop) -> ~1.2",
        guarded_by=(
            "test/test_subclass_wrapper_codegen.py::TestGeneratedWrapperSource::test_flat",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="aot.process_runtime_tangent",
        target="torch._functorch._aot_autograd.runtime_wrappers"
        ":AOTDispatchAutograd.process_runtime_tangent",
        build=tangents.build,
        reason="forced: our runtime's tangent handling (opaque slots kept, no tangent) "
        "runs in place of 2.13's",
        series_none="forced mode only: 2.11's process_runtime_tangent already passes an "
        "opaque slot through as one leaf, so the v2.11.0 series leaves it alone",
        guarded_by=(
            "test/test_point_guards.py::TestOurRuntimeRuns::test_runs_our_process_runtime_tangent",
        ),
        **ONLY_FORCED,
    ),
    PatchPoint(
        name="aot._backward_epilogue_functional",
        target="torch._functorch._aot_autograd.runtime_wrappers:_backward_epilogue_functional",
        build=grad_codegen.backward_epilogue,
        reason="grad subclass rebuild generated once per compiled backward "
        "(2.13 generates it too); torch's path for everything else",
        speed_only="fwd+bwd on N = 100 MeshTensors: 327.5k -> 320.7k extra instructions "
        "per subclass input per call (native 2.13: 322.8k); README, Overhead",
        # the fast path is in effect: the generated rebuild logs its source
        guarded_by=(
            "test/test_grad_codegen.py::TestGeneratedGradWrapperCompiled::test_distinct_and_shared_handles",
            "test/test_grad_codegen.py::TestGeneratedGradWrapperCompiled::test_dynamic_two_dim",
        ),
        **ONLY_BACKPORT,
    ),
]
