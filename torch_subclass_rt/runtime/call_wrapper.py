"""The per-call subclass wrapper around a compiled forward (2.11).

Replaces ``AOTDispatchSubclassWrapper.post_compile`` of torch 2.11.0. Same
contract (boxed call: unwrap subclass args into the flat list, run the
compiled function, rebuild subclass outputs, pass partitioner activations
through), but instead of torch 2.11's data-driven loop over the metadata on
every call, the first call generates a straight-line wrapper with the metadata
baked in (``codegen``; torch >= 2.13 does the same with its own
``subclass_codegen``). It waits for the first call because the plans it is
generated from need runtime-safe metadata (``make_runtime_safe()`` runs after
``post_compile``). With the ``torch._functorch._aot_autograd`` graphs logger
at DEBUG when the function is compiled, torch's original wrapper (which logs
every step) is used.

Note [install() is transparent without opaques]: delegation. torch's own
``post_compile`` builds its wrapper for every compiled function; a call whose
subclass arguments are not exactly the compiled subclass types (inductor
freezing passes ``None`` for frozen subclass parameters) runs through it
unchanged, and the generated fast path is proven identical to it for the
calls it takes (see ``codegen``).

Not part of the patch series (patches/): it changes how fast the wrapper
runs, not what it does; upstream's equivalent is a separate change that
torch 2.13 ships, and the series keeps 2.11's loop, which already handles
opaque slots through the series' creation_fn.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from .codegen import build_subclass_wrapper


def post_compile(original):
    """build(): replaces ``torch._functorch._aot_autograd.runtime_wrappers.
    AOTDispatchSubclassWrapper.post_compile`` (torch 2.11.0, backport only).

    Differs from 2.11: the per-call wrapper it returns runs generated
    straight-line code (``codegen``) from the first call on, instead of
    2.11's loop over the metadata on every call; same results and errors
    (calls it was not generated for run 2.11's wrapper, which is built
    here too). Parallels 2.13.0's ``post_compile``, which calls its own
    ``subclass_codegen.codegen_subclass_wrapper`` (see ``codegen``).
    Note [install() is transparent without opaques]: delegation (module
    docstring)."""
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
                generated = build_subclass_wrapper(
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
