"""``unwrap_tensor_subclass_parameters`` with opaque attrs (torch 2.10 / 2.11).

The code of the points ``aot_autograd.UnwrapTensorSubclass.*`` and
``nn.ParametrizationList.*``.

``UnwrapTensorSubclass`` (the parametrization that replaces a subclass
parameter by its inner tensors) recurses into every attr of
``__tensor_flatten__`` and calls ``__tensor_flatten__`` on an opaque. Torch
2.12 records an ``OpaqueMeta`` for a reference-type opaque attr, passes the
object itself through the flat list, and ``ParametrizationList`` stores it
as a plain attribute ``original{i}`` (not a parameter or buffer, so it is in
neither ``parameters()`` nor ``state_dict()``). This module ports both.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .._torch_compat import is_opaque_attr, is_reference_opaque_type
from ..patching.source_edit import Edit, edited_function
from ..runtime import errors
from ..runtime.meta import OpaqueMeta



# --- UnwrapTensorSubclass ---------------------------------------------------


def _build_forward(original):
    """Replaces ``subclass_parametrization.UnwrapTensorSubclass.forward``
    (torch 2.11.0).

    Differs from 2.11: an ``OpaqueMeta`` attr takes its object from the next
    flat slot as is, instead of recursing into it (torch 2.12 behaviour).
    Note [install() is transparent without opaques]: identical without an
    ``OpaqueMeta`` (2.11's recursion and rebuild).
    """

    @functools.wraps(original)
    def forward(self, *tensors):  # type: ignore[no-untyped-def]
        todo: list[Any] = list(tensors)

        def _unwrap_tensor_subclasses(subclass_meta, tensors, offset):  # type: ignore[no-untyped-def]
            if subclass_meta is None:
                return tensors[offset], offset + 1
            inner_tensors = {}
            for attr, meta in subclass_meta.attrs.items():
                if isinstance(meta, OpaqueMeta):
                    inner_tensors[attr] = tensors[offset]
                    offset += 1
                else:
                    built_tensor, offset = _unwrap_tensor_subclasses(
                        meta, tensors, offset
                    )
                    inner_tensors[attr] = built_tensor
            rebuilt = subclass_meta.class_type.__tensor_unflatten__(
                inner_tensors,
                subclass_meta.metadata,
                subclass_meta.outer_size,
                subclass_meta.outer_stride,
            )
            return rebuilt, offset

        return _unwrap_tensor_subclasses(self.subclass_meta, todo, 0)[0]

    return forward


def _build_right_inverse(original):
    """Replaces ``subclass_parametrization.UnwrapTensorSubclass.right_inverse``
    (torch 2.11.0).

    Differs from 2.11 (as torch 2.12): a reference-type opaque attr gets an
    ``OpaqueMeta`` and the object itself is appended to the flat list;
    a value-type opaque raises ``ValueError``; any other non-tensor attr
    raises ``AssertionError`` (2.11 failed on it with an AttributeError).
    Note [install() is transparent without opaques]: identical for tensor attrs
    (2.11's metadata and flat list); a non-tensor, non-opaque attr is the
    Note's named exception.
    """
    # 2.11's own dataclass, so consumers see the type they expect.
    subclass_creation_meta = original.__globals__["SubclassCreationMeta"]

    @functools.wraps(original)
    def right_inverse(self, tensor: torch.Tensor) -> list[Any]:
        if type(tensor) is torch.Tensor:
            raise AssertionError("tensor must be a subclass, not torch.Tensor")
        plain_tensors: list[Any] = []

        def _create_subclass_meta(tensor, idx, plain_tensor_container):  # type: ignore[no-untyped-def]
            if type(tensor) is torch.Tensor:
                plain_tensor_container.append(tensor)
                return None, idx + 1
            inner_tensors_attrnames, metadata = tensor.__tensor_flatten__()  # type: ignore[attr-defined]
            new_idx = idx
            attr_to_meta: dict[str, Any] = {}
            for attr in inner_tensors_attrnames:
                val = getattr(tensor, attr)
                if is_opaque_attr(val):
                    if not is_reference_opaque_type(type(val)):
                        raise errors.value_opaque_in_tensor_attrs_error(
                            type(val), tensor, attr, exc_type=ValueError
                        )
                    attr_to_meta[attr] = OpaqueMeta()
                    plain_tensor_container.append(val)
                    new_idx += 1
                elif isinstance(val, torch.Tensor):
                    subclass_meta, new_idx = _create_subclass_meta(
                        val, new_idx, plain_tensor_container
                    )
                    attr_to_meta[attr] = subclass_meta
                else:
                    raise AssertionError(
                        f"expected Tensor or OpaqueBase, got {type(val)}"
                    )
            return (
                subclass_creation_meta(
                    start_idx=idx,
                    num_tensors=new_idx - idx,
                    class_type=type(tensor),
                    attrs=attr_to_meta,
                    metadata=metadata,
                    outer_size=tensor.size(),
                    outer_stride=tensor.stride(),
                ),
                new_idx,
            )

        self.subclass_meta = _create_subclass_meta(tensor, 0, plain_tensors)[0]
        return plain_tensors

    return right_inverse


# --- ParametrizationList ----------------------------------------------------
# Both methods are long and only their per-element type checks change, so
# they are source edits of 2.11's text; they call our helpers as
# __tsrt__.<name> (patching/source_edit.py).


def _build_parametrization_list_init(original):
    """``ParametrizationList.__init__`` (torch 2.11.0) with one edit, as 2.12:
    an element of ``right_inverse``'s sequence that is a reference-type opaque
    is stored as a plain attribute ``original{i}``; a value-type opaque raises
    ``ValueError``. The zero-argument ``super()`` keeps working (source_edit
    re-creates the ``__class__`` cell).
    Note [install() is transparent without opaques]: identical (torch's own
    source; the inserted branch only takes opaques).
    """
    return edited_function(
        original,
        [
            Edit(
                """
                for i, originali in enumerate(new):
                    if not isinstance(originali, Tensor):
                """,
                """
                for i, originali in enumerate(new):
                    if __tsrt__.is_opaque_attr(originali):
                        if not __tsrt__.is_reference_opaque_type(type(originali)):
                            raise ValueError(
                                f"'right_inverse' must return a Tensor or a reference-type "
                                f"opaque. Got element {i} of the sequence with type "
                                f"{type(originali).__name__}."
                            )
                        # Not a parameter or buffer: no grad, not in state_dict.
                        setattr(self, f"original{i}", originali)
                        continue
                    if not isinstance(originali, Tensor):
                """,
            )
        ],
    )


def _build_parametrization_list_right_inverse(original):
    """``ParametrizationList.right_inverse`` (torch 2.11.0) with one edit, as
    2.12: a reference-type opaque in the returned sequence replaces the plain
    attribute ``original{i}`` (no dtype check, no ``set_``).
    Note [install() is transparent without opaques]: identical (torch's own
    source; the inserted branch only takes opaques).
    """
    return edited_function(
        original,
        [
            Edit(
                """
                for i, tensor in enumerate(value):
                    original_i = getattr(self, f"original{i}")
                    if not isinstance(tensor, Tensor):
                """,
                """
                for i, tensor in enumerate(value):
                    original_i = getattr(self, f"original{i}")
                    if not isinstance(tensor, Tensor):
                        if __tsrt__.is_opaque_attr(tensor) and __tsrt__.is_reference_opaque_type(
                            type(tensor)
                        ):
                            setattr(self, f"original{i}", tensor)
                            continue
                """,
            ),
            # 2.12's wording of the error, which now also admits opaques.
            Edit(
                """
                f"`right_inverse` must return a sequence of tensors. "
                f"Got element {i} of type {type(tensor).__name__}"
                """,
                """
                f"'right_inverse' must return a sequence of tensors "
                f"or reference-type opaques. Got element {i} of type "
                f"{type(tensor).__name__}."
                """,
            ),
        ],
    )
