"""Generated per-call subclass wrappers: speed only, no series commit.

The compiled forward's subclass unwrap/wrap and the compiled backward's
subclass-grad rebuild are generated once per compiled function (as torch
2.13 does) instead of 2.11's loop over the metadata on every call. They
change how fast the wrappers run, not what they do, so they stay out of the
patch series (``speed_only``).

Releases and modes: 2.10.0, 2.11.0 (backport).
Series commits: none.
Upstream: none (not an upstream fix).
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ..patching.registry import PatchPoint
from ..runtime import codegen, grad_codegen
from ._versions import ONLY_BACKPORT


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


POINTS = [
    PatchPoint(
        name="aot_autograd.AOTDispatchSubclassWrapper.post_compile",
        target="torch._functorch._aot_autograd.runtime_wrappers"
        ":AOTDispatchSubclassWrapper.post_compile",
        build=_build_subclass_post_compile,
        reason="per-call unwrap/wrap decided once per compiled function "
        "(2.13 generates this wrapper's source)",
        # benchmarks/overhead.py --subclass mesh on 2.11 (docs/performance.md,
        # "Per-subclass-input cost")
        speed_only="per-call overhead ratio 1.35 (2.11's loop) -> ~1.2",
        guarded_by=(
            "test/runtime/test_subclass_wrapper_codegen.py::TestGeneratedWrapperSource::test_flat",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="aot_autograd._backward_epilogue_functional",
        target="torch._functorch._aot_autograd.runtime_wrappers:_backward_epilogue_functional",
        build=_build_backward_epilogue,
        reason="grad subclass rebuild generated once per compiled backward "
        "(2.13 generates it too); torch's path for everything else",
        speed_only="fwd+bwd on N = 100 MeshTensors: 327.5k -> 320.7k extra instructions "
        "per subclass input per call (native 2.13: 322.8k); docs/performance.md, Figures",
        # the fast path is in effect: the generated rebuild logs its source
        guarded_by=(
            "test/runtime/test_grad_codegen.py::TestGeneratedGradWrapperCompiled::test_distinct_and_shared_handles",
            "test/runtime/test_grad_codegen.py::TestGeneratedGradWrapperCompiled::test_dynamic_two_dim",
        ),
        **ONLY_BACKPORT,
    ),
]
