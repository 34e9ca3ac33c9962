"""Torch bug: donated buffers of a graph whose subclass input is mutated.

A torch bug with no upstream issue yet (patches/upstream/ISSUES.md, "bw_donated_idxs
point at tangents and outputs when a tensor subclass input is mutated"; our
patches/upstream/0006), fixed on every release we support: wrong values,
silently, on stock torch 2.10.0 to 2.14.1 and torch main.

Releases and modes: 2.10.0, 2.11.0 (backport); 2.12.0, 2.12.1, 2.13.0,
    2.14.0, 2.14.1 (native+fixes); 2.13.0 (forced).
Series commits:
    patches/v2.10.0/0024-aot_autograd-Count-subclass-components-when-finding-.patch,
    patches/v2.11.0/0024-aot_autograd-Count-subclass-components-when-finding-.patch.
Upstream: torch bug: donated buffers of a mutated subclass input (no
    upstream issue yet; patches/upstream/ISSUES.md, patches/upstream/0006).

``collect_bw_donated_buffer_idxs`` splits the forward graph's outputs into
user outputs and saved activations at the inner metadata's ``num_forward``.
When a tensor subclass input that requires grad is mutated, the partitioner
returns every flattened attr of it (torch's note "Recomputing subclass
mutation handling"), but the inner metadata counts it as one output: the
saved activations are taken to start early, every donated index is shifted,
and the last user outputs escape the alias check. Inductor then reuses, in
the backward, "donated" buffers that are the user's output and the caller's
``grad_output`` and writes gradients into them. A subclass with two inner
tensors (a data and a scale, DTensor-like pairs) and an opaque attr is
enough: ``x.mul_(2); return x.exp()``. Without a mutated subclass input the
two counts agree and nothing changes.

The caches: torch keys its compiled artifacts on a hash of its own sources
(``torch_key``), which ``install()`` does not change, and Inductor's FX
graph key does not name the donated buffers. So a backward compiled without
the fix -- by stock torch, or an earlier install() -- would be served from a
warm cache after install() with its buffer reuse baked in (measured: the
same wrong values on 2.14.1 with the AOTAutograd cache off, since the FX
graph cache still hits). Both keys therefore name this change where it may
matter (Note [A fix that changes compiled code is in the cache keys]); the series
needs no edit for it: its change to ``collect_bw_donated_buffer_idxs`` is in
the sources that ``torch_key`` hashes, which is what these points name as
their series counterpart.
"""

from __future__ import annotations

import copy
import functools

from ..patching.registry import PatchPoint
from ._versions import upstream_fix

BROKEN_ON = ("2.10.0", "2.11.0", "2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1")
FIX = (
    "torch bug: donated buffers of a mutated subclass input (no upstream issue yet; "
    "patches/upstream/ISSUES.md, patches/upstream/0006)"
)


def _partitioner_split(fw_module) -> int | None:
    """How many of ``fw_module``'s outputs come before the ones the
    partitioner saved for the backward, read off the output node's
    descriptors (every release we support writes them:
    ``SavedForBackwards[NoVcCheck]AOTOutput``), or ``None`` where a graph
    carries none (then torch's split stands)."""
    from torch._functorch._aot_autograd import descriptors

    saved_kinds = tuple(
        cls
        for cls in (
            getattr(descriptors, "SavedForBackwardsAOTOutput", None),
            getattr(descriptors, "SavedForBackwardsNoVcCheckAOTOutput", None),
        )
        if cls is not None
    )
    outputs = fw_module.graph.find_nodes(op="output")
    if not outputs or not saved_kinds:
        return None
    output = outputs[-1]
    descs = output.meta.get("desc")
    if not isinstance(descs, (list, tuple)) or len(descs) != len(output.args[0]):
        return None
    return len(descs) - sum(isinstance(d, saved_kinds) for d in descs)


def _build_split_where_partitioned(original):
    @functools.wraps(original)
    def collect_bw_donated_buffer_idxs(fw_module, bw_module, fw_metadata):
        """Stands in for ``graph_compile.collect_bw_donated_buffer_idxs``
        (torch 2.10.0 - 2.14.1).

        Differs: the forward outputs are split into user outputs and saved
        activations where the partitioner split them (the saved ones are
        the last outputs, as many as the output node's descriptors mark
        saved), not at ``fw_metadata.num_forward``; torch's function runs
        on a copy of the metadata whose ``num_forward`` says so. The two
        differ only for a tensor subclass input mutated outside of the
        graph (the inner metadata counts none of its flattened attrs), where
        torch's split shifts every donated index: Inductor's backward then
        writes into the user's output and ``grad_output``. Upstream's form
        of the fix (patches/upstream/0006) passes the partitioner's count
        from both callers instead; this one needs no edit to them.
        """
        split = _partitioner_split(fw_module)
        if split is not None and split != fw_metadata.num_forward:
            fw_metadata = copy.copy(fw_metadata)
            fw_metadata.num_forward = split
        return original(fw_module, bw_module, fw_metadata)

    return collect_bw_donated_buffer_idxs


# Note [A fix that changes compiled code is in the cache keys]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
#     AOTAutograd's and Inductor's caches trust ``torch_key`` (a hash of
#     torch's Python sources) to tell compiles by other code apart. A point
#     that changes what a compile produces for a graph stock torch compiles
#     too must put itself into the keys of that graph, or a warm cache hands
#     back the artifact stock torch made. Only this change and
#     saved_activation_strides (the same graphs; it requires this change's
#     key point and adds nothing to the keys) need it so far: the
#     backport's other points change graphs that stock 2.10 / 2.11
#     cannot compile, and on 2.12+ an entry of a graph with opaque inputs
#     saved without install() has no opaque-reads record and is never a hit
#     (Note [Opaque reads in the AOTAutograd cache]).
#
#     Both keys are pickles of a ``FxGraphHashDetails`` (AOTAutograd's is
#     its subclass ``AOTAutogradCacheDetails``), so the details carry it:
#
#     * Inductor's key of a backward names its donated inputs (which
#       inputs the compiled code may overwrite; torch leaves them out of
#       the key, since one torch always computes the same ones). A backward
#       compiled by stock torch with the shifted indices then has another
#       key than the fixed one; a backward the fix does not change gets a
#       key of its own once after install(), and an AOTAutograd entry
#       loads its compiled backward by the key it stored, so entries stay
#       shared with stock torch.
#     * AOTAutograd's key is taken before the graph is traced, when which
#       graphs the fix changes is not known: a graph that may mutate a
#       subclass input (a subclass among its inputs and an in-place call,
#       ``out=`` or ``inplace=True`` in it; :func:`may_mutate_subclass_input`)
#       gets a key of its own. Every other graph keeps stock torch's key,
#       so its entries stay shared (test/points/test_cache_across_modes.py).
#       A mutation this check cannot see (one inside a custom op that does
#       not declare it) keeps stock's key: an entry that stock torch saved
#       for such a graph would be served.
KEY_SALT = "torch_subclass_rt:donated_buffers_split:1"
#: the attribute of the key's details that carries it
KEY_ATTR = "torch_subclass_rt_fixes"

_INPLACE_OPERATORS = frozenset(
    "setitem iadd isub imul imatmul itruediv ifloordiv imod ipow iand ior ixor ilshift irshift".split()
)


def _may_mutate(node) -> bool:
    import operator

    target = node.target
    if node.op == "call_method":
        return isinstance(target, str) and target.endswith("_") and not target.startswith("__")
    if node.op != "call_function":
        return False
    if node.kwargs.get("out") is not None or node.kwargs.get("inplace") is True:
        return True
    if getattr(operator, getattr(target, "__name__", ""), None) is target:
        return target.__name__ in _INPLACE_OPERATORS
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return schema.is_mutable
    name = getattr(target, "__name__", "")
    return name.endswith("_") and not name.startswith("__")


def may_mutate_subclass_input(gm, example_inputs) -> bool:
    """Whether the Dynamo graph ``gm`` might mutate a tensor subclass input:
    a traceable wrapper subclass among ``example_inputs`` and an in-place
    call anywhere in the graph (conservative: one in-place op on any tensor
    is enough)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not any(is_traceable_wrapper_subclass(x) for x in example_inputs):
        return False
    return any(_may_mutate(n) for n in gm.graph.nodes)


def _build_details_with_fix(original):
    @functools.wraps(original)
    def __init__(self, gm, example_inputs, fx_kwargs, *args, **kwargs):
        """Wraps ``torch._inductor.codecache.FxGraphHashDetails.__init__``
        (torch 2.10.0 - 2.14.1), the object both cache keys pickle
        (Inductor's FX graph key; AOTAutograd's through its subclass
        ``AOTAutogradCacheDetails``). Differs: a backward's details name its
        donated inputs, and an AOTAutograd key of a graph that may mutate a
        subclass input names this fix (Note [A fix that changes compiled
        code is in the cache keys])."""
        original(self, gm, example_inputs, fx_kwargs, *args, **kwargs)
        from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCacheDetails

        if isinstance(self, AOTAutogradCacheDetails):
            if may_mutate_subclass_input(gm, example_inputs):
                setattr(self, KEY_ATTR, KEY_SALT)
        elif fx_kwargs.get("is_backward"):
            from torch._inductor.utils import get_donated_idxs

            # none donated is a value too: stock torch's backward of the same
            # graph may have donated some
            donated = get_donated_idxs()
            setattr(self, KEY_ATTR, (KEY_SALT, None if donated is None else tuple(donated)))

    return __init__


POINTS = [
    PatchPoint(
        name="aot_autograd.collect_bw_donated_buffer_idxs.saved_split",
        target="torch._functorch._aot_autograd.graph_compile:collect_bw_donated_buffer_idxs",
        build=_build_split_where_partitioned,
        reason="Inductor's backward overwrote the user's output and grad_output when a "
        "subclass input was mutated: donated-buffer indices shifted by its flattened attrs",
        upstream_fix=FIX,
        series=(
            "0024 torch/_functorch/_aot_autograd/graph_compile.py::collect_bw_donated_buffer_idxs",
        ),
        guarded_by=(
            "test/points/test_donated_buffers_split.py::TestDonatedBuffersSplit::test_donated_idxs_skip_saved_outputs",
            "test/points/test_donated_buffers_split.py::TestDonatedBuffersSplit::test_donated_idxs_point_at_saved_intermediates",
            "test/points/test_donated_buffers_split.py::TestDonatedBuffersSplit::test_inductor_backward_keeps_output_and_grad_output",
        ),
        requires=("inductor.FxGraphHashDetails.__init__.donated_split",),
        **upstream_fix(*BROKEN_ON),
    ),
    PatchPoint(
        name="inductor.FxGraphHashDetails.__init__.donated_split",
        target="torch._inductor.codecache:FxGraphHashDetails.__init__",
        build=_build_details_with_fix,
        reason="a backward compiled without the donated-buffer fix was served from "
        "AOTAutograd's or Inductor's cache after install()",
        upstream_fix=FIX,
        # the series' counterpart: its edit of this function changes the
        # source that torch_key hashes into both keys
        series=(
            "0024 torch/_functorch/_aot_autograd/graph_compile.py::collect_bw_donated_buffer_idxs",
        ),
        guarded_by=(
            "test/points/test_donated_buffers_split.py::TestDonatedBuffersSplit::test_cache_warmed_by_stock_torch",
        ),
        **upstream_fix(*BROKEN_ON),
    ),
]
