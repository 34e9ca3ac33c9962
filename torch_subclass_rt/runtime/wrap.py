"""Rebuilding subclasses from the flat argument list.

``creation_fn`` is installed as a method of torch's ``SubclassCreationMeta``;
it reads only its public fields. At run time it follows a precomputed plan
(``plans``), which places symbolic sizes and strides itself: with an opaque
attr as 2.13 does, without one in the slots torch's own
``compute_outer_size_and_stride`` reads (wrong for dynamic strides on 2.11,
and kept so: see ``plans._torch_symbolic_slots``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .. import _torch_compat as compat
from . import errors, plans
from ._torch_names import aot
from .meta import OpaqueMeta


def creation_fn(self: Any, all_args: Sequence[Any], *, is_runtime: bool) -> Tensor:
    """Replaces ``torch._functorch._aot_autograd.schemas.SubclassCreationMeta.creation_fn``
    (torch 2.11.0 backport; 2.13.0 forced).

    Differs from 2.11: an ``OpaqueMeta`` attr takes the object in its one
    slot (2.11 has no such attr); at run time the outer size and stride come
    from ``plans.run_wrap``, which reads the symbolic strides after the
    sizes (2.11's ``compute_outer_size_and_stride`` re-read the sizes' slots
    for them). Differs from 2.13: at trace time an opaque slot holding
    something else raises ``errors.opaque_slot_mismatch`` (2.13: ``AssertionError:
    OpaqueBase expected``); at run time no slot is type-checked (2.13 checks
    each opaque and tensor slot on every call): the flat list comes from the
    graph this metadata describes.
    Note [install() is transparent without opaques]: identical at trace
    time (same rebuild, same ``_mirror_autograd_meta_to``); at run time
    identical through ``plans.run_wrap``, which reads symbolic sizes and
    strides where torch's own ``compute_outer_size_and_stride`` does for
    metadata without an opaque (2.11's stride slots included). See Note [Opaque attrs in the flat argument list],
    Note [Generated wrappers and the plans rebuild alike] and Note [The
    runtime and the patch series are one change].

    Rebuilds the subclass described by ``self``. Opaque attrs take the
    object found in their slot: at run time that is the caller's (or the
    graph's output) object, never the compile-time one.
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
            if not compat.is_opaque_attr(value):
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

