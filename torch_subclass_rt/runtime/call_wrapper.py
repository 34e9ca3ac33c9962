"""The per-call subclass wrapper around a compiled forward (2.11).

Replaces ``AOTDispatchSubclassWrapper.post_compile`` of torch 2.11.0. Same
contract (boxed call: unwrap subclass args into the flat list, run the
compiled function, rebuild subclass outputs, pass partitioner activations
through), but the per-argument work is decided once, on the first call (the
metadata is runtime-safe by then), instead of re-derived on every call.
torch >= 2.13 gets the same effect by generating source for this wrapper
(``subclass_codegen``). With the ``torch._functorch._aot_autograd`` graphs
logger at DEBUG, torch's original wrapper (which logs every step) is used.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from . import plans
from ._torch_names import aot


def _make_unwrap(inp_metas: list[Any]):
    SubclassCreationMeta = aot().SubclassCreationMeta
    steps = tuple(
        plans.unwrap_plan(m) if type(m) is SubclassCreationMeta else None for m in inp_metas
    )

    def unwrap(args: list[Any]) -> list[Any]:
        out: list[Any] = []
        append = out.append
        # Dynamo's guards pin each argument's type to the one traced, so an
        # argument with plain metadata is never a subclass and vice versa.
        for x, plan in zip(args, steps):
            if plan is None:
                append(x)
            else:
                plans.run_unwrap(plan, x, out, True)
        if len(args) > len(steps):  # extra args without metadata: as is
            out.extend(args[len(steps):])
        return out

    return unwrap


def _make_wrap(out_metas: list[Any], num_saved: int | None):
    names = aot()
    steps: list[tuple[bool, Any]] = []
    tallied = 0
    for m in out_metas:
        if type(m) is names.PlainTensorMeta:
            steps.append((False, m.unwrapped_idx))
            tallied += 1
        elif type(m) is names.SubclassCreationMeta:
            if not m.included_subclass_symints:
                raise AssertionError("included_subclass_symints mismatch: False != True")
            steps.append((True, plans.wrap_plan(m)))
            tallied += m.arg_count
        else:
            raise AssertionError(f"expected SubclassCreationMeta, got {type(m)}")
    expected = tallied + (num_saved or 0)
    run_wrap = plans.run_wrap

    def wrap(outs: Any) -> tuple[Any, ...]:
        if len(outs) != expected:
            raise AssertionError(
                f"compiled forward returned {len(outs)} values, expected {tallied} "
                f"(outputs) + {num_saved or 0} (activations saved for backward)"
            )
        wrapped = [run_wrap(s, outs) if is_sub else outs[s] for is_sub, s in steps]
        if num_saved is not None:
            wrapped.extend(outs[tallied:])
        return tuple(wrapped)

    return wrap


def post_compile(original):
    """build(): the replacement for ``AOTDispatchSubclassWrapper.post_compile``."""
    from torch._functorch._aot_autograd import runtime_wrappers as rw

    @functools.wraps(original)
    def subclass_post_compile(self, compiled_fn, aot_config, *, runtime_metadata):
        if self.maybe_subclass_meta is None:
            return compiled_fn
        if rw.aot_graphs_log.isEnabledFor(logging.DEBUG):
            return original(self, compiled_fn, aot_config, runtime_metadata=runtime_metadata)
        num_saved = self.num_fw_outs_saved_for_bw
        state: dict[str, Any] = {}

        @functools.wraps(compiled_fn)
        def inner_fn(args: list[Any]) -> Any:
            unwrap = state.get("unwrap")
            if unwrap is None:
                unwrap = state["unwrap"] = _make_unwrap(runtime_metadata.subclass_inp_meta)
                state["wrap"] = _make_wrap(
                    runtime_metadata.subclass_fw_graph_out_meta, num_saved
                )
            unwrapped = unwrap(args)
            args.clear()
            return state["wrap"](compiled_fn(unwrapped))

        inner_fn._boxed_call = True  # type: ignore[attr-defined]
        return inner_fn

    return subclass_post_compile
