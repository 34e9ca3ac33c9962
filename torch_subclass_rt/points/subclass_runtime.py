"""Our subclass runtime (``runtime/``) installed into AOTAutograd.

Series patch 0001 ("Opaque reference objects as inner attrs"): ``OpaqueMeta``
and the subclass utilities that flatten a subclass with opaque inner attrs
and rebuild it. Backport (2.10 / 2.11): torch has no OpaqueMeta and its
subclass utilities assume every inner attr is a tensor. Forced (2.13): the
same functions exist with native opaque support; we replace them with ours
so the whole suite runs against our implementation. The ``OpaqueMeta``
marker itself is torch's own class there (see ``runtime/meta.py``), so
nothing needs replacing for it.

Only the functions whose 2.11 version mishandles an opaque are replaced on
2.10 / 2.11 (tools/ablate_points.py checks that dropping each one fails a test).
2.11's ``create_subclass_meta``, ``runtime_unwrap_tensor_subclasses``,
``wrap_tensor_subclasses``, ``get_subclass_typing_container`` and
``process_runtime_tangent`` already treat a non-tensor attr as one flat leaf
(or call our ``create_subclass_metadata`` / ``creation_fn`` through their
module global), and ``compute_outer_size_and_stride`` is only called by the
``creation_fn`` we replace.

Releases and modes: 2.10.0, 2.11.0 (backport); 2.10.0, 2.11.0, 2.13.0
    (backport, forced); 2.13.0 (forced).
Series commits:
    patches/v2.10.0/0001-aot_autograd-Opaque-reference-objects-as-inner-attrs.patch.
Upstream: none (not an upstream fix).
"""

from __future__ import annotations

import functools
from typing import Any

from ..patching.registry import PatchPoint
from ..runtime import flatten, meta, plans, tangents, wrap
from ._versions import ONLY_BACKPORT, ONLY_FORCED, RUNTIME


def _ours(obj):
    return lambda _original: obj


def build_process_runtime_tangent(original: Any) -> staticmethod:
    """What replaces ``AOTDispatchAutograd.process_runtime_tangent`` (torch
    2.13.0 forced, here; 2.10.0 / 2.11.0 backport,
    ``points/tangent_mismatch_message.py``): torch's function for metadata
    without opaques, ours (``runtime/tangents.py``) for metadata with one.
    Note [install() is transparent without opaques]: delegation.

    The dispatcher passes on every argument it got (2.13's generated
    backward prologue passes tangent index, descriptor, compile id and stack
    trace positionally, 2.10 / 2.11's none), so our function can raise
    2.13's detailed error where torch can build it."""
    torch_fn = original.__func__ if isinstance(original, staticmethod) else original

    @functools.wraps(torch_fn)
    def process_runtime_tangent_dispatch(x: Any, meta: Any, *rest: Any, **kw: Any) -> Any:
        if not plans.has_opaque(meta):
            return torch_fn(x, meta, *rest, **kw)
        return tangents.process_runtime_tangent(x, meta, *rest, recurse=process_runtime_tangent_dispatch, **kw)

    return staticmethod(process_runtime_tangent_dispatch)


POINTS = [
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
            "0001 torch/_library/opaque_object.py::UnregisteredInnerAttrError",
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
        name="aot_autograd.process_runtime_tangent",
        target="torch._functorch._aot_autograd.runtime_wrappers"
        ":AOTDispatchAutograd.process_runtime_tangent",
        build=build_process_runtime_tangent,
        reason="forced: our runtime's tangent handling (opaque slots kept, no tangent) "
        "runs in place of 2.13's",
        series_none="forced mode only: 2.11's process_runtime_tangent already passes an "
        "opaque slot through as one leaf, so the v2.11.0 series leaves it alone",
        guarded_by=(
            "test/points/test_point_guards.py::TestOurRuntimeRuns::test_runs_our_process_runtime_tangent",
        ),
        **ONLY_FORCED,
    ),
]
