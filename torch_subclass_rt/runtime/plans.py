"""Precomputed per-call plans for the run-time unwrap/wrap path.

The compiled function's wrapper unwraps every subclass input and rebuilds
every subclass output on *every call*. Walking ``SubclassCreationMeta`` for
that re-derives the same facts each time (which attrs are nested subclasses,
which size/stride entries are symbolic, where each inner value sits in the
flat list). A plan computes them once per metadata object; the per-call loop
then only indexes and calls ``__tensor_unflatten__``.

Plans are built only for run-time metadata (after ``make_runtime_safe()``,
which is the last mutation AOTAutograd makes to it) and are cached by the
identity of the metadata object, held weakly so a freed compiled function
frees its plans too. Attr names come from the metadata, i.e. from
``__tensor_flatten__`` at compile time: Dynamo only reuses a compiled graph
for inputs of the same subclass type and flatten context, and a subclass's
inner attr names are a function of those.

See Note [Generated wrappers and the plans rebuild alike] in ``codegen``
(the generated wrappers inline these plans) and Note [Opaque attrs in the
flat argument list] in ``flatten`` (the layout they index).
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

from ._torch_names import aot


class UnwrapPlan(NamedTuple):
    #: (attr, nested plan or None for a plain tensor / opaque slot)
    attrs: tuple[tuple[str, "UnwrapPlan | None"], ...]
    #: positions of symbolic entries in size() / stride(); empty when static
    size_idx: tuple[int, ...]
    stride_idx: tuple[int, ...]


class WrapPlan(NamedTuple):
    subclass_type: type
    ctx: Any
    #: (attr, flat index, nested plan or None)
    attrs: tuple[tuple[str, int, "WrapPlan | None"], ...]
    outer_size: Any
    outer_stride: Any
    #: flat indices of symbolic sizes / strides (empty when static)
    size_args: tuple[int, ...]
    stride_args: tuple[int, ...]


_cache: dict[tuple[int, str], tuple[weakref.ref, Any]] = {}


def _cached(meta: Any, kind: str, build: Any) -> Any:
    key = (id(meta), kind)
    hit = _cache.get(key)
    if hit is not None and hit[0]() is meta:
        return hit[1]
    plan = build(meta)
    _cache[key] = (weakref.ref(meta, lambda _r, key=key: _cache.pop(key, None)), plan)
    return plan


def _symbolic_positions(outer: Any) -> tuple[int, ...]:
    # make_runtime_safe() turned every non-nested symint into None.
    return tuple(i for i, s in enumerate(outer) if s is None)


def _build_unwrap(meta: Any) -> UnwrapPlan:
    SubclassCreationMeta = aot().SubclassCreationMeta
    attrs = tuple(
        (attr, _build_unwrap(m) if type(m) is SubclassCreationMeta else None)
        for attr, m in meta.attrs.items()
    )
    return UnwrapPlan(
        attrs, _symbolic_positions(meta.outer_size), _symbolic_positions(meta.outer_stride)
    )


def _build_wrap(meta: Any) -> WrapPlan:
    SubclassCreationMeta = aot().SubclassCreationMeta
    if meta.original_subclass_type is None:
        raise AssertionError("original_subclass_type must not be None at runtime")
    attrs = []
    idx = meta.flat_tensor_start_idx
    for attr, m in meta.attrs.items():
        if type(m) is SubclassCreationMeta:
            attrs.append((attr, idx, _build_wrap(m)))
            idx += m.arg_count
        else:  # plain tensor or opaque: one slot
            attrs.append((attr, idx, None))
            idx += 1
    n_size = len(_symbolic_positions(meta.outer_size))
    n_stride = len(_symbolic_positions(meta.outer_stride))
    if _any_opaque(meta):
        # 2.13's reading (the series' fix): sizes, then strides, after the
        # inner slots
        size_args = tuple(range(idx, idx + n_size))
        stride_args = tuple(range(idx + n_size, idx + n_size + n_stride))
    else:
        size_args, stride_args = _torch_symbolic_slots(meta, idx)
    return WrapPlan(
        meta.original_subclass_type,
        meta.meta,
        tuple(attrs),
        meta.outer_size,
        meta.outer_stride,
        size_args,
        stride_args,
    )


def _torch_symbolic_slots(meta: Any, idx: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The flat indices torch's own ``SubclassCreationMeta.compute_outer_size_and_stride``
    reads the symbolic sizes and strides from, found by calling it once on
    a list whose every entry is its own index.

    Note [install() is transparent without opaques]: proven identical by
    construction. Torch 2.11 reads symbolic strides from the sizes' slots (a
    bug 2.13 fixed: a dynamic 2-D subclass output gets stride (s0, 1) for
    (s1, 1)); a subclass without opaques keeps 2.11's result under
    install(), as on stock 2.11, while metadata with an opaque (which stock
    2.11 cannot compile at all) gets 2.13's reading, as the series has it.
    """
    sentinel = list(range(idx + 2 * (len(meta.outer_size) + len(meta.outer_stride)) + 1))
    size, stride = meta.compute_outer_size_and_stride(sentinel, curr_start_idx=idx)
    size, stride = tuple(size), tuple(stride)
    return (
        tuple(size[i] for i in _symbolic_positions(meta.outer_size)),
        tuple(stride[i] for i in _symbolic_positions(meta.outer_stride)),
    )


def _any_opaque(meta: Any) -> bool:
    from .meta import OpaqueMeta

    SubclassCreationMeta = aot().SubclassCreationMeta
    return any(
        type(m) is OpaqueMeta or (type(m) is SubclassCreationMeta and _any_opaque(m))
        for m in meta.attrs.values()
    )


def has_opaque(meta: Any) -> bool:
    """Whether an ``OpaqueMeta`` sits anywhere in this metadata (cached per
    metadata object). Decides, per Note [install() is transparent without
    opaques], whether a replacement hands the work to torch's function."""
    if type(meta) is not aot().SubclassCreationMeta:
        return False
    return _cached(meta, "has_opaque", _any_opaque)


def unwrap_plan(meta: Any) -> UnwrapPlan:
    return _cached(meta, "unwrap", _build_unwrap)


def wrap_plan(meta: Any) -> WrapPlan:
    return _cached(meta, "wrap", _build_wrap)


def _fill(outer: Any, values: list[Any]) -> tuple[Any, ...]:
    it = iter(values)
    return tuple(next(it) if s is None else s for s in outer)


def run_wrap(plan: WrapPlan, args: Any) -> Any:
    """The run-time half of ``SubclassCreationMeta.creation_fn`` (torch
    2.11.0 / 2.13.0, ``is_runtime=True``) with the walk precomputed, its
    ``compute_outer_size_and_stride`` included.

    Differs from 2.11: an opaque slot is passed as is (like a plain
    tensor's); for metadata with an opaque, symbolic strides are read after
    the sizes, not from the sizes' slots (the 2.13 behaviour); without one,
    from wherever torch's own ``compute_outer_size_and_stride`` reads them
    (:func:`_torch_symbolic_slots`). Differs from 2.13: no per-call type
    check of tensor and opaque slots. See Note [Generated wrappers and the
    plans rebuild alike]: ``codegen._wrap_expr`` is its inline form."""
    inner = {
        attr: (args[idx] if sub is None else run_wrap(sub, args))
        for attr, idx, sub in plan.attrs
    }
    size, stride = plan.outer_size, plan.outer_stride
    if plan.size_args:
        size = _fill(size, [args[i] for i in plan.size_args])
    if plan.stride_args:
        stride = _fill(stride, [args[i] for i in plan.stride_args])
    return plan.subclass_type.__tensor_unflatten__(inner, plan.ctx, size, stride)
