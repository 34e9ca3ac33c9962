"""Torch bug: the saved activations' strides of a graph whose subclass input is mutated.

A torch bug with no upstream issue yet (patches/upstream/ISSUES.md, "Backward
restrides the wrong saved activations when a tensor subclass input is
mutated"; our patches/upstream/0007), fixed on every release we support: the
compiled backward fails (or reads a saved activation with the wrong layout)
on stock torch 2.10.0 to 2.14.1 and torch main.

Releases and modes: 2.10.0, 2.11.0 (backport); 2.12.0, 2.12.1, 2.13.0,
    2.14.0, 2.14.1 (native+fixes); 2.13.0 (forced).
Series commits:
    patches/v2.10.0/0025-aot_autograd-Find-saved-activations-strides-past-sub.patch,
    patches/v2.11.0/0025-aot_autograd-Find-saved-activations-strides-past-sub.patch.
Upstream: torch bug: saved activations' strides of a mutated subclass input
    (no upstream issue yet; patches/upstream/ISSUES.md, patches/upstream/0007).

Before it compiles the backward, ``_aot_stage2b_bw_compile`` gives each
saved activation the stride the compiled forward returns it with, taking the
saved activations to start at the inner metadata's ``num_forward``. The
donated-buffer split (points/donated_buffers_split.py) has the same
miscount: a tensor subclass input that requires grad and is mutated makes
the forward graph return all of its flattened attrs ahead of the user
outputs (torch's note "Recomputing subclass mutation handling"), and
``num_forward`` counts none of them. The strides shift by that many
outputs: a saved activation gets a user output's stride, and Inductor
compiles the backward for a layout the forward does not produce.
``x.mul_(2); return torch.mm(x, x).sin().t() * 2`` on a ``TwoTensor`` is
enough: "AssertionError: expected size 4==4, stride 4==1 at dim=0" when the
backward runs. Without a mutated subclass input both starts agree and
nothing changes.

The caches: a backward compiled with the shifted strides has other example
strides, so Inductor's FX graph key differs from the fixed one's; the
AOTAutograd entry stock torch saved for such a graph (whose backward fails)
is left behind by the key that points/donated_buffers_split.py gives every
graph that may mutate a subclass input, which this point ``requires``
(Note [A fix that changes compiled code is in the cache keys]).
"""

from __future__ import annotations

import functools

from ..patching.registry import PatchPoint
from ._versions import upstream_fix

BROKEN_ON = ("2.10.0", "2.11.0", "2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1")
FIX = (
    "torch bug: saved activations' strides of a mutated subclass input (no upstream issue yet; "
    "patches/upstream/ISSUES.md, patches/upstream/0007)"
)

def saved_activation_count(bw_module, num_symints_saved_for_bw: int) -> int:
    """How many saved activations (tensors and opaques, not sizes) the
    backward takes: its inputs after the saved sizes that are not tangents,
    RNG seeds or the backward state (the partitioner's order)."""
    from torch._functorch import partitioners

    placeholders = bw_module.graph.find_nodes(op="placeholder")
    return sum(
        not (
            partitioners._is_tangent(p)
            or partitioners._is_bwd_seed_offset(p)
            or partitioners._is_backward_state(p)
        )
        for p in placeholders[num_symints_saved_for_bw:]
    )


def _build_strides_where_partitioned(original):
    import inspect

    signature = inspect.signature(original)

    @functools.wraps(original)
    def _aot_stage2b_bw_compile(*args, **kwargs):
        """Stands in for ``graph_compile._aot_stage2b_bw_compile`` (torch
        2.10.0 - 2.14.1).

        Differs: the forward's output strides it is given start where the
        saved activations do, as many outputs before the saved sizes as the
        backward takes saved activations, so that torch's slice of them at
        the inner metadata's ``num_forward`` lands on the saved activations.
        Torch's start misses the flattened attrs of a tensor subclass input
        mutated outside of the graph, and restrides saved activations with
        user outputs' strides. Upstream's form (patches/upstream/0007)
        passes the partitioner's ``num_fw_outs_saved_for_bw`` from the
        caller instead; this one needs no edit to it.
        """
        bound = signature.bind(*args, **kwargs)
        arguments = bound.arguments
        strides = arguments["fwd_output_strides"]
        if strides is not None:
            from torch._functorch._aot_autograd import graph_compile

            num_symints = arguments["num_symints_saved_for_bw"]
            inner_meta = graph_compile._get_inner_meta(
                arguments["maybe_subclass_meta"], arguments["fw_metadata"]
            )
            saved = saved_activation_count(arguments["bw_module"], num_symints)
            extra = len(strides) - num_symints - saved - inner_meta.num_forward
            if extra > 0:
                # torch's slice ends relative to the end: only its start moves
                arguments["fwd_output_strides"] = strides[extra:]
                return original(*bound.args, **bound.kwargs)
        return original(*args, **kwargs)

    return _aot_stage2b_bw_compile


POINTS = [
    PatchPoint(
        name="aot_autograd._aot_stage2b_bw_compile.saved_strides",
        target="torch._functorch._aot_autograd.graph_compile:_aot_stage2b_bw_compile",
        build=_build_strides_where_partitioned,
        reason="the compiled backward failed on a stride check when a subclass input was "
        "mutated: saved activations were restrided with user outputs' strides",
        upstream_fix=FIX,
        series=(
            "0025 torch/_functorch/_aot_autograd/graph_compile.py::_aot_stage2b_bw_compile",
        ),
        guarded_by=(
            "test/points/test_saved_activation_strides.py::TestSavedActivationStrides::test_inductor_backward_with_transposed_output",
            "test/points/test_saved_activation_strides.py::TestSavedActivationStrides::test_inductor_backward_with_opaque_config",
        ),
        requires=("inductor.FxGraphHashDetails.__init__.donated_split",),
        **upstream_fix(*BROKEN_ON),
    ),
]
