"""Straight-line source for the compiled backward's grad rebuild (2.11).

After the compiled backward returns its flat grads, the epilogue rebuilds a
subclass grad for every subclass input (``grad_input_metas``). torch 2.11
walks the metadata for that on every backward (``wrap_tensor_subclasses`` ->
``creation_fn`` -> a plan per subclass in our runtime); here the walk is
done once per compiled function and turned into the source of one function
with every index, subclass type and flatten context baked in, e.g. for
a plain input and a ``MeshTensor(_local, mesh)`` input::

    def grad_wrapper(outs):
        if len(outs) != 3: return _walk1(outs)
        return (outs[0], _out_type2.__tensor_unflatten__(
            {'_local': outs[1], 'mesh': outs[2]}, _ctx3, _size4, _stride5),)

The expressions are the forward wrapper's (``codegen._wrap_expr``), so a
grad is rebuilt exactly as a forward output is (see Note [Generated wrappers
and the plans rebuild alike] in ``codegen``); the flat grads follow the
layout of Note [Opaque attrs in the flat argument list] in ``flatten``, as
the tangents flattened into the backward's inputs do (``tangents``): one
slot per opaque, holding the object itself. Upstream counterpart: torch
2.13.0's ``subclass_codegen.codegen_backward_subclass_fns``, whose wrap
function 2.13's generated backward epilogue calls; ours is our own
generator for 2.11's functional epilogue, not a copy.

Replaces nothing that changes behaviour: ``backward_epilogue`` stands in for
torch 2.11.0's ``runtime_wrappers._backward_epilogue_functional`` and lets
the original do everything but the subclass rebuild (backward tokens, the
functionalized-rng offset). Every case the generated function does not
cover goes to torch's own path with the same arguments, so it returns or
raises exactly what torch 2.11 + our runtime did: a flat grad list of
another length than the metadata's (the walker's IndexError or count
AssertionError), metadata it would reject (``included_subclass_symints``
False, no ``original_subclass_type``), ``grad_input_metas`` None, and
compiled autograd (which passes ``make_subclass_override`` to put proxies
in the graph). Not part of the patch series: speed only.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from .._generated_source import build_generated_function
from . import codegen, plans
from ._torch_names import aot

log = logging.getLogger(__name__)


class _NotGenerated(Exception):
    """Metadata the generated function does not cover: torch's path runs."""


def grad_wrapper_source(
    grad_input_metas: Sequence[Any], walk: Callable[[Any], Any]
) -> tuple[str, dict[str, Any]]:
    """Source and globals of ``grad_wrapper(outs)`` for runtime-safe metadata;
    ``walk(outs)`` is the metadata walker it defers to on a count mismatch."""
    names = aot()
    src = codegen._Source()
    fallback = src.bind("_walk", walk)
    results: list[str] = []
    tallied = 0
    for meta in grad_input_metas:
        if type(meta) is names.PlainTensorMeta:
            results.append(f"outs[{meta.unwrapped_idx}]")
            tallied += 1
        elif type(meta) is names.SubclassCreationMeta and meta.included_subclass_symints:
            try:
                results.append(codegen._wrap_expr(src, plans.wrap_plan(meta)))
            except AssertionError as e:  # e.g. no original_subclass_type
                raise _NotGenerated(str(e)) from e
            tallied += meta.arg_count
        else:
            raise _NotGenerated(f"unexpected metadata {type(meta).__name__}")
    ret = f"({', '.join(results)},)" if results else "()"
    body = [f"    if len(outs) != {tallied}: return {fallback}(outs)", f"    return {ret}"]
    return "def grad_wrapper(outs):\n" + "\n".join(src.lines + body) + "\n", src.globals


def build_grad_wrapper(
    grad_input_metas: Sequence[Any], walk: Callable[[Any], Any]
) -> Callable[[Any], tuple[Any, ...]]:
    source, env = grad_wrapper_source(grad_input_metas, walk)
    # as the forward wrapper (codegen.build_subclass_wrapper): linecache,
    # DEBUG log, trace artifact
    return build_generated_function(
        source,
        "grad_wrapper",
        env,
        stem=f"{__file__}:grad_wrapper",
        log=log,
        title="generated grad wrapper",
        artifact="torch_subclass_rt_grad_wrapper",
    )


#: SubclassMeta (identity-hashed dataclass) -> generated function, or None
#: where torch's path runs; held weakly so a freed compiled function frees it
_generated: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def backward_epilogue(original: Callable[..., Any]) -> Callable[..., Any]:
    """build(): replaces ``torch._functorch._aot_autograd.runtime_wrappers.
    _backward_epilogue_functional`` (torch 2.11.0, backport only).

    Differs from 2.11: nothing a caller can see. The subclass grads of a
    compiled backward are rebuilt by a function generated once per
    ``SubclassMeta`` instead of 2.11's walk over ``grad_input_metas``
    (``wrap_tensor_subclasses``) on every backward; everything else, and
    every case the generated function does not cover, is 2.11's own
    function (module docstring). Note [install() is transparent without
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
                fn = build_grad_wrapper(maybe_subclass_metadata.grad_input_metas, walk)
            except _NotGenerated:
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
