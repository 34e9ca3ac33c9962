"""AOTAutograd (``torch._functorch._aot_autograd``): install our subclass
runtime (``runtime/``) into torch, and AOTAutograd's share of the other
changes (their code in the private modules it imports).

Backport (2.10 / 2.11): torch has no OpaqueMeta and its subclass utilities assume
every inner attr is a tensor. Forced (2.13): the same functions exist with
native opaque support; we replace them with ours so the whole suite runs
against our implementation. The ``OpaqueMeta`` marker itself is torch's own
class there (see ``runtime/meta.py``), so nothing needs replacing for it.

Only the functions whose 2.11 version mishandles an opaque are replaced on
2.10 / 2.11 (tools/ablate_points.py checks that dropping each one fails a test).
2.11's ``create_subclass_meta``, ``runtime_unwrap_tensor_subclasses``,
``wrap_tensor_subclasses``, ``get_subclass_typing_container`` and
``process_runtime_tangent`` already treat a non-tensor attr as one flat leaf
(or call our ``create_subclass_metadata`` / ``creation_fn`` through their
module global), and ``compute_outer_size_and_stride`` is only called by the
``creation_fn`` we replace.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ..patching.registry import PatchPoint
from ..runtime import codegen, flatten, grad_codegen, meta, plans, tangents, wrap
from ._versions import ONLY_2_10, ONLY_BACKPORT, ONLY_FORCED, RUNTIME, upstream_fix, per_release
from . import _derived_submesh, _functional, _opaque_reads, _parametrize, _torch_2_11_base, _upstream_fixes


def _ours(obj):
    return lambda _original: obj


# The per-call subclass wrapper around a compiled forward (2.11):
# Replaces ``AOTDispatchSubclassWrapper.post_compile`` of torch 2.11.0. Same
# contract (boxed call: unwrap subclass args into the flat list, run the
# compiled function, rebuild subclass outputs, pass partitioner activations
# through), but instead of torch 2.11's data-driven loop over the metadata on
# every call, the first call generates a straight-line wrapper with the metadata
# baked in (``codegen``; torch >= 2.13 does the same with its own
# ``subclass_codegen``). It waits for the first call because the plans it is
# generated from need runtime-safe metadata (``make_runtime_safe()`` runs after
# ``post_compile``). With the ``torch._functorch._aot_autograd`` graphs logger
# at DEBUG when the function is compiled, torch's original wrapper (which logs
# every step) is used.
#
# Note [install() is transparent without opaques]: delegation. torch's own
# ``post_compile`` builds its wrapper for every compiled function; a call whose
# subclass arguments are not exactly the compiled subclass types (inductor
# freezing passes ``None`` for frozen subclass parameters) runs through it
# unchanged, and the generated fast path is proven identical to it for the
# calls it takes (see ``codegen``).
#
# Not part of the patch series (patches/): it changes how fast the wrapper
# runs, not what it does; upstream's equivalent is a separate change that
# torch 2.13 ships, and the series keeps 2.11's loop, which already handles
# opaque slots through the series' creation_fn.
def _build_subclass_post_compile(original):
    """Replaces ``torch._functorch._aot_autograd.runtime_wrappers.
    AOTDispatchSubclassWrapper.post_compile`` (torch 2.11.0, backport only).

    Differs from 2.11: the per-call wrapper it returns runs generated
    straight-line code (``codegen``) from the first call on, instead of
    2.11's loop over the metadata on every call; same results and errors
    (calls it was not generated for run 2.11's wrapper, which is built
    here too). Parallels 2.13.0's ``post_compile``, which calls its own
    ``subclass_codegen.codegen_subclass_wrapper`` (see ``codegen``).
    Note [install() is transparent without opaques]: delegation (below)."""
    from torch._functorch._aot_autograd import runtime_wrappers as rw

    @functools.wraps(original)
    def subclass_post_compile(self, compiled_fn, aot_config, *, runtime_metadata):
        if self.maybe_subclass_meta is None:
            return compiled_fn
        # 2.11 logs the unwrapped arguments with TORCH_LOGS=aot_graphs
        # (only its own loop does); 2.10 has no such log
        graphs_log = getattr(rw, "aot_graphs_log", None)
        if graphs_log is not None and graphs_log.isEnabledFor(logging.DEBUG):
            return original(self, compiled_fn, aot_config, runtime_metadata=runtime_metadata)
        num_saved = self.num_fw_outs_saved_for_bw
        # torch's own loop, for every call the generated code does not take
        torch_loop = original(self, compiled_fn, aot_config, runtime_metadata=runtime_metadata)
        generated = None

        @functools.wraps(compiled_fn)
        def inner_fn(args: list[Any]) -> Any:
            nonlocal generated
            if generated is None:
                generated = codegen.build_subclass_wrapper(
                    compiled_fn,
                    runtime_metadata.subclass_inp_meta,
                    runtime_metadata.subclass_fw_graph_out_meta,
                    num_saved,
                    torch_loop,
                )
            return generated(args)

        inner_fn._boxed_call = True  # type: ignore[attr-defined]
        return inner_fn

    return subclass_post_compile


def _build_process_runtime_tangent(original: Any) -> staticmethod:
    """``AOTDispatchAutograd.process_runtime_tangent`` (torch 2.13.0, forced
    only): torch's function for metadata without opaques, ours
    (``runtime/tangents.py``) for metadata with one. Note [install() is
    transparent without opaques]: delegation.

    The dispatcher passes on every argument it got (2.13's generated
    backward prologue passes tangent index, descriptor, compile id and stack
    trace positionally), so our function can raise 2.13's detailed error."""
    torch_fn = original.__func__ if isinstance(original, staticmethod) else original

    @functools.wraps(torch_fn)
    def process_runtime_tangent_dispatch(x: Any, meta: Any, *rest: Any, **kw: Any) -> Any:
        if not plans.has_opaque(meta):
            return torch_fn(x, meta, *rest, **kw)
        return tangents.process_runtime_tangent(x, meta, *rest, recurse=process_runtime_tangent_dispatch, **kw)

    return staticmethod(process_runtime_tangent_dispatch)


#: SubclassMeta (identity-hashed dataclass) -> generated function, or None
#: where torch's path runs; held weakly so a freed compiled function frees it
_generated: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def _build_backward_epilogue(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._functorch._aot_autograd.runtime_wrappers.
    _backward_epilogue_functional`` (torch 2.11.0, backport only).

    Differs from 2.11: nothing a caller can see. The subclass grads of a
    compiled backward are rebuilt by a function generated once per
    ``SubclassMeta`` instead of 2.11's walk over ``grad_input_metas``
    (``wrap_tensor_subclasses``) on every backward; everything else, and
    every case the generated function does not cover, is 2.11's own
    function (``runtime/grad_codegen.py``). Note [install() is transparent without
    opaques]: delegation."""

    @functools.wraps(original)
    def _backward_epilogue_functional(
        metadata: Any,
        maybe_subclass_metadata: Any,
        out: Any,
        *,
        make_subclass_override: Any = None,
    ) -> tuple[Any, ...]:
        if (
            maybe_subclass_metadata is None
            or make_subclass_override is not None
            or maybe_subclass_metadata.grad_input_metas is None
        ):
            return original(
                metadata, maybe_subclass_metadata, out,
                make_subclass_override=make_subclass_override,
            )
        fn = _generated.get(maybe_subclass_metadata, False)
        if fn is False:
            # first backward: the metadata is runtime-safe by now
            # (make_runtime_safe() runs when the function is compiled)
            walk = functools.partial(_walk, maybe_subclass_metadata.grad_input_metas)
            try:
                fn = grad_codegen.build_grad_wrapper(maybe_subclass_metadata.grad_input_metas, walk)
            except grad_codegen._NotGenerated:
                fn = None
            _generated[maybe_subclass_metadata] = fn
        if fn is None:
            return original(metadata, maybe_subclass_metadata, out)
        # torch's epilogue without the subclass step: tokens, rng offset, tuple
        return fn(original(metadata, None, out))

    return _backward_epilogue_functional


def _walk(grad_input_metas: Sequence[Any], outs: Any) -> tuple[Any, ...]:
    """torch 2.11's subclass step of the epilogue, as it calls it."""
    from torch._functorch._aot_autograd import runtime_wrappers

    return runtime_wrappers.wrap_tensor_subclasses(
        outs,
        subclass_metas=grad_input_metas,
        included_subclass_symints=True,
        is_runtime=True,
        make_subclass_override=None,
    )


def _neutral(
    name: str,
    neutral: object,
    reason: str,
    rebinds: tuple[str, ...],
    guarded_by: tuple[str, ...],
) -> PatchPoint:
    return PatchPoint(
        name=f"aot_autograd.{name}",
        target=f"torch._functorch._aot_autograd.functional_utils:{name}",
        build=_functional._answer_for_opaques(neutral),
        reason=reason,
        rebinds=rebinds,
        guarded_by=guarded_by,
        series=(f"0001 torch/_functorch/_aot_autograd/functional_utils.py::{name}",),
        **ONLY_BACKPORT,
    )


POINTS = [
    *per_release(
        name="aot_autograd._aot_stage2a_partition",
        target="torch._functorch._aot_autograd.graph_compile:_aot_stage2a_partition",
        v2_11=dict(
            build=_derived_submesh._build_aot_stage2a_partition,
            reason="a real opaque saved for backward was not counted as a saved opaque (2.13: is_opaque_node)",
            series_none=_derived_submesh._NOT_YET_IN_SERIES,
            guarded_by=(_derived_submesh._REAL_OPAQUE_SAVED_TEST,),
        ),
        # what 2.11 has (patch 0000), with the 2.11 edit's opaque case
        v2_10=dict(
            build=_torch_2_11_base._build_aot_stage2a_partition,
            reason="the count of opaques saved for backward was not recorded",
            series=("0000 torch/_functorch/_aot_autograd/graph_compile.py::_aot_stage2a_partition",),
            guarded_by=(_torch_2_11_base._BACKWARD_TEST,),
        ),
    ),
    PatchPoint(
        name="aot_autograd.ViewAndMutationMeta.num_opaque_objects_saved_for_bw",
        target=f"{_torch_2_11_base._SCHEMAS}:ViewAndMutationMeta.num_opaque_objects_saved_for_bw",
        # a class-level default; _aot_stage2a_partition sets the instance's
        build=lambda _: None,
        new_attribute=True,
        reason="no field for the count of opaques saved for backward",
        series=(
            "0000 torch/_functorch/_aot_autograd/schemas.py::ViewAndMutationMeta",
        ),
        # an AOTAutogradCache entry stock torch saved has no such field; the
        # class default makes it read as "no opaque saved" under install()
        guarded_by=(
            _torch_2_11_base._BACKWARD_TEST,
            "test/points/test_cache_across_modes.py::TestCacheAcrossInstall"
            "::test_stock_entry_loaded_with_install",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="aot_autograd.ViewAndMutationMeta.tensors_saved_for_backwards_slice",
        target=f"{_torch_2_11_base._SCHEMAS}:ViewAndMutationMeta.tensors_saved_for_backwards_slice",
        build=_torch_2_11_base._build_tensors_saved_slice,
        reason="the saved-tensor slice took the saved opaques as tensors",
        series=(
            "0000 torch/_functorch/_aot_autograd/schemas.py::ViewAndMutationMeta.tensors_saved_for_backwards_slice",
        ),
        guarded_by=(_torch_2_11_base._BACKWARD_TEST,),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="aot_autograd.ViewAndMutationMeta.opaque_objects_saved_for_backwards_slice",
        target=f"{_torch_2_11_base._SCHEMAS}:ViewAndMutationMeta.opaque_objects_saved_for_backwards_slice",
        build=_torch_2_11_base._build_opaques_saved_slice,
        new_attribute=True,
        reason="no slice for the saved opaques",
        series=(
            "0000 torch/_functorch/_aot_autograd/schemas.py::ViewAndMutationMeta.opaque_objects_saved_for_backwards_slice",
        ),
        guarded_by=(_torch_2_11_base._BACKWARD_TEST,),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="aot_autograd.AOTDispatchAutograd.post_compile",
        target="torch._functorch._aot_autograd.runtime_wrappers:AOTDispatchAutograd.post_compile",
        build=_torch_2_11_base._build_autograd_post_compile,
        reason="saved opaques were not kept on the ctx for the backward",
        series=(
            "0000 torch/_functorch/_aot_autograd/runtime_wrappers.py::AOTDispatchAutograd.post_compile",
            "0001 torch/_functorch/_aot_autograd/runtime_wrappers.py::AOTDispatchAutograd.post_compile",
            "0001 torch/_functorch/_aot_autograd/runtime_wrappers.py::_compiled_autograd_opaque_error",
        ),
        guarded_by=(
            _torch_2_11_base._BACKWARD_TEST,
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU"
            "::test_tensor_subclass_opaque_backward_compiled_autograd_cpu",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="aot_autograd.OpaqueMeta",
        target="torch._functorch._aot_autograd.schemas:OpaqueMeta",
        build=_ours(meta.OpaqueMeta),
        reason="marker for an opaque slot in SubclassCreationMeta.attrs (new in 2.12)",
        new_attribute=True,
        series=("0001 torch/_functorch/_aot_autograd/schemas.py::OpaqueMeta",),
        guarded_by=(
            "test/points/test_point_guards.py::TestPointGuards::test_opaque_meta_defined_in_schemas",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="aot_autograd.OpaqueMeta.reexport",
        target="torch._functorch.aot_autograd:OpaqueMeta",
        build=_ours(meta.OpaqueMeta),
        reason="2.12 re-exports OpaqueMeta from torch._functorch.aot_autograd",
        new_attribute=True,
        series=("0001 torch/_functorch/aot_autograd.py::<imports>",),
        guarded_by=("test/points/test_point_guards.py::TestPointGuards::test_opaque_meta_reexported",),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="aot_autograd.SubclassCreationMeta.creation_fn",
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
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
            "test/points/test_point_guards.py::TestOurRuntimeRuns::test_runs_our_creation_fn",
        ),
        **RUNTIME,
    ),
    PatchPoint(
        name="aot_autograd.create_subclass_metadata",
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
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
            "test/points/test_point_guards.py::TestOurRuntimeRuns::test_runs_our_create_subclass_metadata",
        ),
        **RUNTIME,
    ),
    PatchPoint(
        name="aot_autograd.unwrap_tensor_subclasses",
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
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_no_stale_compile_time_opaque_canary_cpu",
            "test/points/test_point_guards.py::TestOurRuntimeRuns::test_runs_our_unwrap_tensor_subclasses",
        ),
        **RUNTIME,
    ),
    PatchPoint(
        name="aot_autograd.AOTDispatchSubclassWrapper.post_compile",
        target="torch._functorch._aot_autograd.runtime_wrappers"
        ":AOTDispatchSubclassWrapper.post_compile",
        build=_build_subclass_post_compile,
        reason="per-call unwrap/wrap decided once per compiled function "
        "(2.13 generates this wrapper's source)",
        # benchmarks/overhead.py --subclass mesh on 2.11 (README "Overhead")
        speed_only="per-call overhead ratio 1.35 (2.11's loop) -> ~1.2",
        guarded_by=(
            "test/runtime/test_subclass_wrapper_codegen.py::TestGeneratedWrapperSource::test_flat",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="aot_autograd.process_runtime_tangent",
        target="torch._functorch._aot_autograd.runtime_wrappers"
        ":AOTDispatchAutograd.process_runtime_tangent",
        build=_build_process_runtime_tangent,
        reason="forced: our runtime's tangent handling (opaque slots kept, no tangent) "
        "runs in place of 2.13's",
        series_none="forced mode only: 2.11's process_runtime_tangent already passes an "
        "opaque slot through as one leaf, so the v2.11.0 series leaves it alone",
        guarded_by=(
            "test/points/test_point_guards.py::TestOurRuntimeRuns::test_runs_our_process_runtime_tangent",
        ),
        **ONLY_FORCED,
    ),
    PatchPoint(
        name="aot_autograd._backward_epilogue_functional",
        target="torch._functorch._aot_autograd.runtime_wrappers:_backward_epilogue_functional",
        build=_build_backward_epilogue,
        reason="grad subclass rebuild generated once per compiled backward "
        "(2.13 generates it too); torch's path for everything else",
        speed_only="fwd+bwd on N = 100 MeshTensors: 327.5k -> 320.7k extra instructions "
        "per subclass input per call (native 2.13: 322.8k); README, Overhead",
        # the fast path is in effect: the generated rebuild logs its source
        guarded_by=(
            "test/runtime/test_grad_codegen.py::TestGeneratedGradWrapperCompiled::test_distinct_and_shared_handles",
            "test/runtime/test_grad_codegen.py::TestGeneratedGradWrapperCompiled::test_dynamic_two_dim",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="aot_autograd.sc_visit",
        target="torch._functorch._aot_autograd.graph_capture_wrappers:sc_visit",
        build=lambda _original: _functional.sc_visit,
        reason="mutation counters of a mutated subclass input read .elem of an opaque",
        guarded_by=(
            "test/runtime/test_opaque_subclass_parity.py::TestOpaqueSubclassParityCPU"
            "::test_inplace_mutation_of_subclass_input_with_grad_cpu",
        ),
        series=("0007 torch/_functorch/_aot_autograd/graph_capture_wrappers.py::sc_visit",),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="aot_autograd.is_fun",
        target="torch._functorch._aot_autograd.functional_utils:is_fun",
        build=_functional._build_is_fun,
        reason="'mixed functional/non-functional inner tensors' on opaque attrs",
        rebinds=(
            "torch._functorch.aot_autograd",
            "torch._functorch._aot_autograd.graph_capture_wrappers",
        ),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
        ),
        series=("0001 torch/_functorch/_aot_autograd/functional_utils.py::is_fun",),
        **ONLY_BACKPORT,
    ),
    _neutral(
        "sync_functional_tensor",
        None,
        "torch._sync() rejects an opaque (joint graph inner_fn)",
        (
            "torch._functorch.aot_autograd",
            "torch._functorch._aot_autograd.graph_capture_wrappers",
        ),
        ("test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::"
         "test_tensor_subclass_with_opaque_attr_backward_cpu",),
    ),
    _neutral(
        "are_all_mutations_under_no_grad_or_inference_mode",
        True,
        "2.11 asserts a FunctionalTensor (input mutated under no_grad)",
        (
            "torch._functorch.aot_autograd",
            "torch._functorch._aot_autograd.collect_metadata_analysis",
            "torch._functorch._aot_autograd.graph_capture_wrappers",
        ),
        ("test/points/test_point_guards.py::TestPointGuards::test_input_mutation_under_no_grad",),
    ),
    PatchPoint(
        name="aot_autograd.UnwrapTensorSubclass.forward",
        target="torch._functorch._aot_autograd.subclass_parametrization"
        ":UnwrapTensorSubclass.forward",
        series=(
            "0004 torch/_functorch/_aot_autograd/subclass_parametrization.py"
            "::UnwrapTensorSubclass.forward",
        ),
        build=_parametrize._build_forward,
        reason="rebuild the subclass with its opaque attrs from the flat originals",
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_subclass_parametrization_with_opaque_attrs_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="aot_autograd.UnwrapTensorSubclass.right_inverse",
        target="torch._functorch._aot_autograd.subclass_parametrization"
        ":UnwrapTensorSubclass.right_inverse",
        series=(
            "0004 torch/_functorch/_aot_autograd/subclass_parametrization.py"
            "::UnwrapTensorSubclass.right_inverse",
        ),
        build=_parametrize._build_right_inverse,
        reason="OpaqueMeta for opaque attrs; the object is one flat original",
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_subclass_parametrization_with_opaque_attrs_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="aot_autograd.unwrap_tensor_subclasses.value_opaque_output",
        target="torch._functorch._aot_autograd.subclass_utils:unwrap_tensor_subclasses",
        build=_upstream_fixes._build_value_opaque_outputs_stay_constants,
        reason="a value opaque output next to a subclass output became a FakeScriptObject "
        "constant (None after an FX-graph-cache hit)",
        upstream_fix="PR 193190",
        series_none="torch 2.11 with the backport (or the series) does not have this bug "
        "(test/points/test_upstream_fixes.py: broken on 2.12.x, 2.13.0, 2.14.x), so the point "
        "does not apply to 2.11.0 and the v2.11.0 series does not carry the fix",
        rebinds=(
            "torch._functorch.aot_autograd",
            "torch._functorch._aot_autograd.graph_capture_wrappers",
        ),
        guarded_by=(
            "test/points/test_upstream_fixes.py::TestUpstreamFixes::test_opaque_constant_with_subclass_output_cache_hit",
            "test/points/test_upstream_fixes.py::TestUpstreamFixes::test_value_type_graph_output_subclass_metadata_side_effect",
        ),
        **upstream_fix("2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1"),
    ),
    PatchPoint(
        name="aot_autograd._log_fw_bw_graphs.lazy_metadata_log",
        target="torch._functorch._aot_autograd.graph_compile:_log_fw_bw_graphs",
        build=_upstream_fixes._build_lazy_fw_bw_log,
        reason="a subclass without __repr__ could not be trained under compile: the "
        "metadata log record was formatted eagerly, printing fake tangents",
        upstream_fix="issue 152183 (torch 2.12.0 formats the record lazily; PR 185632 "
        "later makes the repr itself subclass-safe)",
        series=("0018 torch/_functorch/_aot_autograd/graph_compile.py::_log_fw_bw_graphs",),
        guarded_by=_upstream_fixes._NO_REPR_TESTS,
        **upstream_fix("2.10.0", "2.11.0"),
    ),
    PatchPoint(
        name="aot_autograd.aot_dispatch_base_graph.lazy_metadata_log",
        target="torch._functorch._aot_autograd.graph_capture:aot_dispatch_base_graph",
        build=_upstream_fixes._build_lazy_base_graph_log,
        reason="a subclass without __repr__ could not be compiled for inference: the "
        "metadata log record was formatted eagerly, printing fake subclasses",
        upstream_fix="issue 152183 (torch 2.12.0 formats the record lazily; PR 185632 "
        "later makes the repr itself subclass-safe)",
        series=("0018 torch/_functorch/_aot_autograd/graph_capture.py::aot_dispatch_base_graph",),
        rebinds=("torch._functorch._aot_autograd.graph_compile",),
        guarded_by=_upstream_fixes._NO_REPR_INFERENCE_TESTS,
        **upstream_fix("2.10.0", "2.11.0"),
    ),
    PatchPoint(
        name="aot_autograd.collect_fw_donated_buffer_idxs.skip_opaques",
        target="torch._functorch._aot_autograd.graph_compile:collect_fw_donated_buffer_idxs",
        build=_upstream_fixes._build_donated_buffers_skip_opaques,
        reason="the donated-buffer analysis read untyped_storage() off a saved opaque",
        upstream_fix="torch 2.12.0 donated-buffer check (a FakeTensor check in "
        "collect_fw_donated_buffer_idxs; no upstream issue: 2.12 shipped it with opaques "
        "saved as graph inputs)",
        series=(
            "0018 torch/_functorch/_aot_autograd/graph_compile.py::collect_fw_donated_buffer_idxs",
        ),
        guarded_by=_upstream_fixes._DONATED_TESTS,
        **upstream_fix("2.10.0", "2.11.0"),
    ),
    PatchPoint(
        name="aot_autograd.autograd_cache_key.opaque_reads",
        target="torch._functorch._aot_autograd.autograd_cache:autograd_cache_key",
        build=_opaque_reads._build_autograd_cache_key,
        reason="AOTAutogradCache reused a graph whose tracing read other values off an "
        "opaque input (a recompile in one process; ranks sharing a cache)",
        upstream_fix=_opaque_reads.FIX,
        series_none=_opaque_reads.SERIES_NONE,
        guarded_by=_opaque_reads.IN_PROCESS_TESTS,
        **upstream_fix(*_opaque_reads.BROKEN_ON),
    ),
    PatchPoint(
        name="aot_autograd.AOTAutogradCache.save.opaque_reads",
        target="torch._functorch._aot_autograd.autograd_cache:AOTAutogradCache.save",
        build=_opaque_reads._build_save,
        reason="a cache entry carries the opaque member reads its graph was traced with",
        upstream_fix=_opaque_reads.FIX,
        series_none=_opaque_reads.SERIES_NONE,
        guarded_by=_opaque_reads.HIT_TESTS,
        **upstream_fix(*_opaque_reads.BROKEN_ON),
    ),
]
