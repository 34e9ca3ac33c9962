"""Straight-line source for the per-call subclass wrapper of a compiled forward.

The wrapper around a compiled forward unwraps every subclass argument into the
flat list, calls the compiled function and rebuilds every subclass output, on
every call. ``plans`` already derives, once per metadata object, which attrs
are nested subclasses, where each inner value sits in the flat list and which
size/stride entries are symbolic; walking those plans per call still costs a
Python-level loop, a dict comprehension and a recursive call per subclass.
Here the plans are turned into the source of one function with every index,
attr name, subclass type and flatten context baked in, e.g. for a
``MeshTensor(_local, mesh)`` input and output::

    def subclass_wrapper(args):
        a0 = args[0]
        if type(a0) is not _in_type1: return torch_loop(args)
        flat = [a0._local, a0.mesh]
        if len(args) > 1: flat.extend(args[1:])
        args.clear()
        outs = compiled_fn(flat)
        if len(outs) != 2: raise _bad_output_count(len(outs))
        return (_out_type0.__tensor_unflatten__(
            {'_local': outs[0], 'mesh': outs[1]}, _ctx0, _size0, _stride0),)

Opaque attrs are one slot each, exactly like a plain inner tensor (see
Note [Opaque attrs in the flat argument list] in ``flatten``).

Note [install() is transparent without opaques] holds here by delegation: the
fast path only runs when every argument the metadata marks as a subclass
arrives as exactly that subclass; any other call (inductor freezing passes
``None`` for a frozen subclass parameter, a plain tensor can replace a frozen
constant, a subclass of the subclass) goes, untouched, to ``torch_loop``, the
wrapper torch's own ``post_compile`` built, so it does whatever torch's loop
does with it. Where the fast path runs it is identical to torch's loop: same
flat list (inner attrs in ``__tensor_flatten__`` order, which Dynamo's guards
fix per compiled graph; symbolic sizes then strides), same trailing
arguments, same rebuild through ``__tensor_unflatten__``, same activations.

Upstream counterpart: torch 2.13.0's
``torch/_functorch/_aot_autograd/subclass_codegen.py``, whose
``codegen_subclass_wrapper`` 2.13's ``AOTDispatchSubclassWrapper.post_compile``
calls (and whose ``codegen_backward_subclass_fns`` generates the backward's
grad rebuild, our ``grad_codegen``). This is our own generator for torch
2.11, where the wrapper is a data-driven loop, not a copy of 2.13's. It
differs in what it leaves to torch: 2.13 bakes in inputs frozen by
inductor freezing (``frozen_inp_indices``: ``None`` in their slot) and the
``act_input_indices`` that 2.11's metadata lacks, and asserts the type of
every other subclass argument; ours hands any call whose subclass
arguments are not exactly the compiled types to ``torch_loop``.
Installed only in backport mode (the point
``aot_autograd.AOTDispatchSubclassWrapper.post_compile``), speed only, outside the
patch series (CONTRIBUTING.md).

Note [Generated wrappers and the plans rebuild alike]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
One layout, three rebuilds: ``plans`` (``wrap_plan`` / ``run_wrap``, which
``wrap.creation_fn`` runs at run time, e.g. from torch's own loop and
walker), the source generated here (``_wrap_expr`` / ``_unwrap_items``)
and ``grad_codegen`` (which reuses ``_wrap_expr`` for subclass grads).
For the same runtime-safe metadata they must read the same flat slots in
the same order and call ``__tensor_unflatten__`` with the same inner
dict, context, outer size and stride; the generated code only inlines
what a plan holds, so a change to the layout (see Note [Opaque attrs in
the flat argument list] in ``flatten``) or to the plans is made in all
three, and ``test/runtime/test_subclass_wrapper_codegen.py`` /
``test/runtime/test_grad_codegen.py`` compare them.
"""

from __future__ import annotations

import keyword
import logging
from collections.abc import Callable, Sequence
from typing import Any

from .._generated_source import build_generated_function
from . import plans
from ._torch_names import aot

log = logging.getLogger(__name__)


class _Source:
    """Lines of the generated function and the globals they refer to."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.globals: dict[str, Any] = {}
        self._counter = 0

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    def fresh(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def bind(self, prefix: str, value: Any) -> str:
        name = self.fresh(prefix)
        self.globals[name] = value
        return name


def _attr_access(var: str, attr: str) -> str:
    if attr.isidentifier() and not keyword.iskeyword(attr):
        return f"{var}.{attr}"
    return f"getattr({var}, {attr!r})"


def _unwrap_items(src: _Source, plan: plans.UnwrapPlan, var: str, items: list[str]) -> None:
    """Append to ``items`` the expressions of ``var``'s flat values, in order."""
    for attr, nested in plan.attrs:
        if nested is None:  # plain inner tensor or opaque: one slot
            items.append(_attr_access(var, attr))
        else:
            inner = src.fresh("i")
            src.emit(f"{inner} = {_attr_access(var, attr)}")
            _unwrap_items(src, nested, inner, items)
    for method, positions in (("size", plan.size_idx), ("stride", plan.stride_idx)):
        if positions:
            held = src.fresh(method[:2])
            src.emit(f"{held} = {var}.{method}()")
            items.extend(f"{held}[{i}]" for i in positions)


def _outer_expr(src: _Source, outer: Any, flat_indices: tuple[int, ...], prefix: str) -> str:
    """The outer size/stride: the compile-time value when static, else a
    tuple whose symbolic entries (None after make_runtime_safe) come from
    the flat outputs."""
    if not flat_indices:
        return src.bind(prefix, outer)
    fill = iter(flat_indices)
    parts = []
    for s in outer:
        if s is None:
            parts.append(f"outs[{next(fill)}]")
        elif type(s) is int:
            parts.append(repr(s))
        else:  # a nested int's runtime stand-in: pass it through as torch does
            parts.append(src.bind(prefix, s))
    return f"({', '.join(parts)},)"


def _wrap_expr(src: _Source, plan: plans.WrapPlan) -> str:
    # See Note [Generated wrappers and the plans rebuild alike]: the inline
    # form of plans.run_wrap(plan, outs).
    entries = ", ".join(
        f"{attr!r}: " + (f"outs[{idx}]" if nested is None else _wrap_expr(src, nested))
        for attr, idx, nested in plan.attrs
    )
    cls = src.bind("_out_type", plan.subclass_type)
    ctx = src.bind("_ctx", plan.ctx)
    size = _outer_expr(src, plan.outer_size, plan.size_args, "_size")
    stride = _outer_expr(src, plan.outer_stride, plan.stride_args, "_stride")
    return f"{cls}.__tensor_unflatten__({{{entries}}}, {ctx}, {size}, {stride})"



def subclass_wrapper_source(
    inp_metas: Sequence[Any], out_metas: Sequence[Any], num_saved: int | None
) -> tuple[str, dict[str, Any]]:
    """Source and globals of ``subclass_wrapper(args)`` for runtime-safe
    metadata (``compiled_fn`` and ``torch_loop`` are bound by the caller)."""
    names = aot()
    src = _Source()

    items: list[str] = []
    for i, meta in enumerate(inp_metas):
        if type(meta) is names.SubclassCreationMeta:
            var = f"a{i}"
            expected = meta.original_subclass_type or type(meta.original_subclass)
            cls = src.bind("_in_type", expected)
            src.emit(f"{var} = args[{i}]")
            # anything else (None for a frozen parameter, ...): torch's loop
            src.emit(f"if type({var}) is not {cls}: return torch_loop(args)")
            _unwrap_items(src, plans.unwrap_plan(meta), var, items)
        else:
            items.append(f"args[{i}]")
    n = len(inp_metas)
    src.emit(f"flat = [{', '.join(items)}]")
    # trailing args without metadata (rng seed/offset): passed as they are
    src.emit(f"if len(args) > {n}: flat.extend(args[{n}:])")
    src.emit("args.clear()")
    src.emit("outs = compiled_fn(flat)")

    results: list[str] = []
    tallied = 0
    for meta in out_metas:
        if type(meta) is names.PlainTensorMeta:
            results.append(f"outs[{meta.unwrapped_idx}]")
            tallied += 1
        elif type(meta) is names.SubclassCreationMeta:
            if not meta.included_subclass_symints:
                raise AssertionError("included_subclass_symints mismatch: False != True")
            results.append(_wrap_expr(src, plans.wrap_plan(meta)))
            tallied += meta.arg_count
        else:
            raise AssertionError(f"expected SubclassCreationMeta, got {type(meta)}")

    expected_outs = tallied + (num_saved or 0)

    def bad_output_count(got: int) -> AssertionError:
        return AssertionError(
            f"compiled forward returned {got} values, expected {tallied} "
            f"(outputs) + {num_saved or 0} (activations saved for backward)"
        )

    err = src.bind("_bad_output_count", bad_output_count)
    src.emit(f"if len(outs) != {expected_outs}: raise {err}(len(outs))")
    ret = f"({', '.join(results)},)" if results else "()"
    if num_saved is not None:
        # the partitioner's extra activations follow the user outputs, unwrapped
        ret = f"{ret} + tuple(outs[{tallied}:])"
    src.emit(f"return {ret}")
    return "def subclass_wrapper(args):\n" + "\n".join(src.lines) + "\n", src.globals


def build_subclass_wrapper(
    compiled_fn: Callable[[list[Any]], Any],
    inp_metas: Sequence[Any],
    out_metas: Sequence[Any],
    num_saved: int | None,
    torch_loop: Callable[[list[Any]], Any],
) -> Callable[[list[Any]], Any]:
    """The generated wrapper as a function (boxed call convention).

    ``torch_loop``: torch's own per-call wrapper around the same
    ``compiled_fn``, called with the untouched ``args`` for any call whose
    subclass arguments are not exactly the compiled types."""
    source, env = subclass_wrapper_source(inp_metas, out_metas, num_saved)
    env["compiled_fn"] = compiled_fn
    env["torch_loop"] = torch_loop
    # File name: this module's path (Dynamo treats the frame like the rest of
    # this package) plus a digest of the text, registered with linecache so a
    # traceback through the wrapper shows its generated lines.
    return build_generated_function(
        source,
        "subclass_wrapper",
        env,
        stem=f"{__file__}:subclass_wrapper",
        log=log,
        title="generated subclass wrapper",
        artifact="torch_subclass_rt_subclass_wrapper",
    )
