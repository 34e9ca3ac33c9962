"""Straight-line source for the compiled backward's grad rebuild (2.10 / 2.11).

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

Changes nothing but speed: the point
``aot_autograd._backward_epilogue_functional`` (``points/subclass_runtime.py``)
stands in for torch 2.11.0's ``runtime_wrappers._backward_epilogue_functional``
and lets the original do everything but the subclass rebuild (backward tokens, the
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

import logging
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
