"""AOTAutograd: install our subclass runtime (``runtime/``) into torch.

Backport (2.11): torch has no OpaqueMeta and its subclass utilities assume
every inner attr is a tensor. Forced (2.13): the same functions exist with
native opaque support; we replace them with ours so the whole suite runs
against our implementation. The ``OpaqueMeta`` marker itself is torch's own
class there (see ``runtime/meta.py``), so nothing needs replacing for it.
"""

from __future__ import annotations

from ..patching.registry import PatchPoint
from ..runtime import call_wrapper, flatten, meta, tangents, wrap
from ._versions import ONLY_BACKPORT, RUNTIME

_AOT = "torch._functorch._aot_autograd"
_SU = f"{_AOT}.subclass_utils"


def _ours(obj):
    return lambda _original: obj


POINTS = [
    PatchPoint(
        name="aot.OpaqueMeta",
        target=f"{_AOT}.schemas:OpaqueMeta",
        build=_ours(meta.OpaqueMeta),
        reason="marker for an opaque slot in SubclassCreationMeta.attrs (new in 2.12)",
        new_attribute=True,
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="aot.OpaqueMeta.reexport",
        target="torch._functorch.aot_autograd:OpaqueMeta",
        build=_ours(meta.OpaqueMeta),
        reason="2.12 re-exports OpaqueMeta from torch._functorch.aot_autograd",
        new_attribute=True,
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="aot.SubclassCreationMeta.creation_fn",
        target=f"{_AOT}.schemas:SubclassCreationMeta.creation_fn",
        build=_ours(wrap.creation_fn),
        reason="rebuild subclasses with the opaque found in the flat args",
        **RUNTIME,
    ),
    PatchPoint(
        name="aot.SubclassCreationMeta.compute_outer_size_and_stride",
        target=f"{_AOT}.schemas:SubclassCreationMeta.compute_outer_size_and_stride",
        build=_ours(wrap.compute_outer_size_and_stride),
        reason="2.11 read dynamic strides from the sizes' offset",
        **RUNTIME,
    ),
    PatchPoint(
        name="aot.create_subclass_metadata",
        target=f"{_SU}:create_subclass_metadata",
        build=_ours(flatten.create_subclass_metadata),
        reason="OpaqueMeta for reference opaques; clear errors for anything else",
        **RUNTIME,
    ),
    PatchPoint(
        name="aot.create_subclass_meta",
        target=f"{_SU}:create_subclass_meta",
        build=_ours(flatten.create_subclass_meta),
        reason="per-argument metadata built by our create_subclass_metadata",
        rebinds=(f"{_AOT}.collect_metadata_analysis", f"{_AOT}.graph_capture_wrappers"),
        **RUNTIME,
    ),
    PatchPoint(
        name="aot.get_subclass_typing_container",
        target=f"{_SU}:get_subclass_typing_container",
        build=_ours(flatten.get_subclass_typing_container),
        reason="export collects subclass types; do not recurse into opaques",
        rebinds=("torch.export._trace",),
        **RUNTIME,
    ),
    PatchPoint(
        name="aot.unwrap_tensor_subclasses",
        target=f"{_SU}:unwrap_tensor_subclasses",
        build=_ours(flatten.unwrap_tensor_subclasses),
        reason="opaques must enter the trace as FakeScriptObjects (graph inputs), "
        "else the graph returns the compile-time object",
        rebinds=("torch._functorch.aot_autograd", f"{_AOT}.graph_capture_wrappers"),
        **RUNTIME,
    ),
    PatchPoint(
        name="aot.runtime_unwrap_tensor_subclasses",
        target=f"{_SU}:runtime_unwrap_tensor_subclasses",
        build=flatten.build_runtime_unwrap,
        reason="per-call unwrap: opaques take one flat slot",
        rebinds=(f"{_AOT}.runtime_wrappers",),
        **RUNTIME,
    ),
    PatchPoint(
        name="aot.wrap_tensor_subclasses",
        target=f"{_SU}:wrap_tensor_subclasses",
        build=_ours(wrap.wrap_tensor_subclasses),
        reason="per-call rebuild of subclass outputs through precomputed plans",
        rebinds=("torch._functorch.aot_autograd", f"{_AOT}.runtime_wrappers"),
        **RUNTIME,
    ),
    PatchPoint(
        name="aot.AOTDispatchSubclassWrapper.post_compile",
        target=f"{_AOT}.runtime_wrappers:AOTDispatchSubclassWrapper.post_compile",
        build=call_wrapper.post_compile,
        reason="per-call unwrap/wrap decided once per compiled function "
        "(2.13 generates this wrapper's source)",
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="aot.process_runtime_tangent",
        target=f"{_AOT}.runtime_wrappers:AOTDispatchAutograd.process_runtime_tangent",
        build=tangents.build,
        reason="opaque attrs have no tangent; keep their slot",
        **RUNTIME,
    ),
]

