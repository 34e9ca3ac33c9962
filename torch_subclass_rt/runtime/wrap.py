"""Rebuilding subclasses from the flat argument list.

``creation_fn`` and ``compute_outer_size_and_stride`` are installed as methods
of torch's ``SubclassCreationMeta``; they read only its public fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
import torch.utils._pytree as pytree

from .. import _torch_compat as compat
from . import errors, plans
from ._torch_names import aot
from .flatten import compute_symint_placeholders
from .meta import OpaqueMeta


def compute_outer_size_and_stride(
    self: Any, all_args: Sequence[Any], *, curr_start_idx: int
) -> tuple[Any, Any]:
    """Outer size/stride of a subclass at run time: symbolic entries come from
    the flat args after its inner attrs (sizes first, then strides).

    torch 2.11 sliced the strides from ``curr_start_idx`` again instead of
    continuing after the sizes, which mis-rebuilt subclasses with more than
    one dynamic dim (fixed upstream by 2.13); this is the 2.13 behaviour.
    Note [install() is transparent without opaques]: a named exception (the only
    difference without opaques is this fix).
    """

    def take(outer: Any, start: int) -> tuple[Any, int]:
        placeholders = compute_symint_placeholders(outer)
        if not any(placeholders):
            return outer, start
        end = start + sum(placeholders)
        it_args = iter(all_args[start:end])
        it_placeholders = iter(placeholders)
        return (
            pytree.tree_map_only(
                lambda _: next(it_placeholders), lambda _: next(it_args), outer
            ),
            end,
        )

    outer_size, next_idx = take(self.outer_size, curr_start_idx)
    outer_stride, _ = take(self.outer_stride, next_idx)
    return outer_size, outer_stride


def creation_fn(self: Any, all_args: Sequence[Any], *, is_runtime: bool) -> Tensor:
    """Rebuild the subclass described by ``self`` (a SubclassCreationMeta).

    Opaque attrs take the object found in their slot: at run time that is the
    caller's (or the graph's output) object, never the compile-time one.

    Replaces ``SubclassCreationMeta.creation_fn``. Note [install() is transparent without opaques]:
    identical at trace time (same rebuild, same ``_mirror_autograd_meta_to``);
    at run time identical through ``plans.run_wrap`` but for the outer-stride
    fix of ``compute_outer_size_and_stride`` (a named exception).
    """
    if is_runtime:
        # Hot path (every call): a precomputed plan, no per-slot checks; the
        # flat list was produced by the graph whose metadata this is.
        return plans.run_wrap(plans.wrap_plan(self), all_args)
    PlainTensorMeta = aot().PlainTensorMeta
    inner: dict[str, Any] = {}
    idx = self.flat_tensor_start_idx
    for attr, attr_meta in self.attrs.items():
        if type(attr_meta) is OpaqueMeta:
            value = all_args[idx]
            if not compat.is_opaque_object(value):
                raise errors.opaque_slot_mismatch(
                    self.original_subclass_type or type(self.original_subclass), attr, value
                )
            idx += 1
        elif type(attr_meta) is PlainTensorMeta:
            value = all_args[idx]
            if not isinstance(value, Tensor):
                raise AssertionError(f"Tensor expected for {attr!r}, got {type(value)}")
            idx += 1
        else:
            value = attr_meta.creation_fn(all_args, is_runtime=is_runtime)
            idx += attr_meta.arg_count
        inner[attr] = value

    rebuilt = type(self.original_subclass).__tensor_unflatten__(
        inner, self.meta, self.outer_size, self.outer_stride
    )
    # Traced through the autograd engine: the rebuilt wrapper needs the
    # original's autograd metadata (requires_grad, grad_fn-ness).
    torch._mirror_autograd_meta_to(self.original_subclass, rebuilt)  # type: ignore[attr-defined]
    return rebuilt


def wrap_tensor_subclasses(
    unwrapped_args: Sequence[Any],
    *,
    subclass_metas: Sequence[Any],
    num_fw_outs_saved_for_bw: int | None = None,
    included_subclass_symints: bool = False,
    is_runtime: bool = False,
    make_subclass_override: Any = None,
) -> tuple[Any, ...]:
    """Rebuild the outer values (plain or subclass) from the flat list.

    ``subclass_metas`` describe the user-visible outputs; with
    ``num_fw_outs_saved_for_bw``, the flat list ends with that many extra
    activations the partitioner added, returned unwrapped after them
    (Note: [Partitioner handling for Subclasses, Part 2] in torch).

    Replaces ``subclass_utils.wrap_tensor_subclasses``. Note [install() is transparent without opaques]:
    identical (same loop, checks, messages and activations).
    """
    names = aot()
    PlainTensorMeta, SubclassCreationMeta = names.PlainTensorMeta, names.SubclassCreationMeta
    wrapped: list[Any] = []
    tallied = 0
    for meta in subclass_metas:
        if type(meta) is PlainTensorMeta:
            wrapped.append(unwrapped_args[meta.unwrapped_idx])
            tallied += 1
            continue
        if type(meta) is not SubclassCreationMeta:
            raise AssertionError(f"expected SubclassCreationMeta, got {type(meta)}")
        if meta.included_subclass_symints != included_subclass_symints:
            raise AssertionError(
                f"included_subclass_symints mismatch: {meta.included_subclass_symints} "
                f"!= {included_subclass_symints}"
            )
        if make_subclass_override:
            wrapped.append(make_subclass_override(meta, is_runtime, unwrapped_args))
        else:
            wrapped.append(meta.creation_fn(unwrapped_args, is_runtime=is_runtime))
        tallied += meta.arg_count

    if num_fw_outs_saved_for_bw is None:
        if len(unwrapped_args) != tallied:
            raise AssertionError(f"Expected {len(unwrapped_args)} == {tallied}")
        return tuple(wrapped)
    if len(unwrapped_args) != tallied + num_fw_outs_saved_for_bw:
        raise AssertionError(
            f"Expected the number actual unwrapped-subclass outputs {len(unwrapped_args)} "
            f"to equal the number of args calculated from subclasses ({tallied}) plus the "
            f"number of additional activations saved for the backward pass "
            f"({num_fw_outs_saved_for_bw})"
        )
    return (*wrapped, *unwrapped_args[tallied:])
