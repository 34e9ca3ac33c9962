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
from . import errors
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
    """
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

    if is_runtime:
        subclass_type = self.original_subclass_type
        if subclass_type is None:
            raise AssertionError("original_subclass_type must not be None at runtime")
        outer_size, outer_stride = self.compute_outer_size_and_stride(
            all_args, curr_start_idx=idx
        )
    else:
        subclass_type = type(self.original_subclass)
        outer_size, outer_stride = self.outer_size, self.outer_stride

    rebuilt = subclass_type.__tensor_unflatten__(inner, self.meta, outer_size, outer_stride)
    if not is_runtime:
        # Traced through the autograd engine: the rebuilt wrapper needs the
        # original's autograd metadata (requires_grad, grad_fn-ness).
        torch._mirror_autograd_meta_to(self.original_subclass, rebuilt)  # type: ignore[attr-defined]
    return rebuilt
