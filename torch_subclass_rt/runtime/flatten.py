"""Subclass metadata and unwrapping into the flat argument list.

Note [Opaque attrs in the flat argument list]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``__tensor_flatten__`` may name, among its inner attrs, instances of
registered *reference*-type opaque classes (a device-mesh handle, a process
group handle). AOTAutograd flattens every subclass argument into a list of
plain tensors (and, for dynamic shapes, symints); an opaque attr takes one
slot of that list at its position among the inner attrs, so:

* at trace time the slot holds a ``FakeScriptObject`` made under the active
  fake mode, which the proxy tracer tracks as a graph input (placeholder).
  Passing the real object instead makes the tracer treat it as a constant
  attribute of the graph module (``_opaque_obj0 = self._opaque_obj0``), and the
  compiled function silently returns the compile-time object forever;
* at run time the slot holds the caller's object, and ``wrap.creation_fn``
  rebuilds output subclasses with the object the graph returns, so one
  compiled graph serves every mesh;
* the subclass metadata marks the slot with ``OpaqueMeta``; it has no
  tangent, no memory format and no symints.

Value-type opaques compare by ``__eq__`` and belong in the flatten *context*
(they are guarded on and baked in), so they are rejected among inner attrs.

Every producer and consumer of the flat list must agree on this layout (see
Note [Opaque attrs in the flat argument list] in each): here
``create_subclass_metadata`` and ``unwrap_tensor_subclasses``; ``wrap``'s
``creation_fn`` and ``plans``' wrap plans (rebuild); ``codegen`` and
``grad_codegen`` (the same, generated); ``tangents`` (a tangent's leaves);
and the edited torch sources that flatten subclasses themselves (Dynamo,
fake tensors, parametrization in ``points/``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import SymInt, Tensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .. import _torch_compat as compat
from . import errors
from ._torch_names import aot
from .meta import OpaqueMeta


def classify_tensor_flatten_attr(subclass: Any, attr: str, value: Any) -> str:
    """"tensor" or "opaque" for a value listed by ``__tensor_flatten__``.

    Raises the user-facing errors for anything else.
    """
    if isinstance(value, Tensor):
        return "tensor"
    if compat.is_opaque_attr(value):
        real_type = type(compat.unwrap_fake_opaque(value))
        if not compat.is_reference_opaque_type(real_type):
            raise errors.not_an_inner_attr_error(subclass, attr, value)
        return "opaque"
    raise errors.unregistered_object_in_tensor_attrs_error(subclass, attr, value)


def enumerate_filter_symints(lst: Sequence[Any]) -> list[tuple[int, SymInt]]:
    """Our copy of ``subclass_utils.enumerate_filter_symints`` (torch 2.11.0
    and 2.13.0, the same in both); not installed, same results."""
    # Nested ints (jagged dims) are not graph inputs: NJT rebuilds them.
    return [
        (i, s)
        for i, s in enumerate(lst)
        if isinstance(s, SymInt) and not s.node.is_nested_int()
    ]



def maybe_suggest_memory_format(t: Any, with_memory_format: bool) -> Any:
    """Our copy of ``subclass_utils.maybe_suggest_memory_format`` (torch
    2.11.0 and 2.13.0, the same in both); not installed, same results."""
    if not with_memory_format:
        return None
    return aot().MemoryFormatMeta.from_tensor(t)


def create_subclass_metadata(
    a: Any, start_idx: int, count_symints: bool, with_memory_format: bool = False
) -> tuple[Any, int]:
    """Replaces ``torch._functorch._aot_autograd.subclass_utils.create_subclass_metadata``
    (torch 2.11.0 backport; 2.13.0 forced).

    Differs from 2.11: a reference-type opaque attr gets an ``OpaqueMeta``
    and one slot (2.11 recursed into it as if it were a plain tensor); a
    value-type opaque raises 2.12's RuntimeError, an attr that is neither a
    tensor nor a registered opaque our TypeError (2.11 built a
    ``PlainTensorMeta`` for either). Differs from 2.13: the same two errors
    carry a hint on what to do (2.13: the RuntimeError's first two sentences
    only; a bare ``AssertionError: expected Tensor or OpaqueBase``); the
    ``isinstance(a, Tensor)`` assert torch makes after the attrs is left
    out (``is_traceable_wrapper_subclass`` already implies it).
    Note [install() is transparent without opaques]: identical for tensor
    attrs (same walk, indices, symint counts and fields); a non-tensor,
    non-opaque attr is the Note's named exception.
    See Note [Opaque attrs in the flat argument list] and Note [The runtime
    and the patch series are one change].

    Metadata to rebuild ``a`` from the flat list starting at ``start_idx``;
    returns ``(meta, next_idx)``. A plain tensor takes one slot; a subclass
    takes the slots of its inner attrs (recursively; one per opaque)
    followed, with ``count_symints``, by its symbolic sizes and strides.
    """
    names = aot()
    if not is_traceable_wrapper_subclass(a):
        idx = start_idx + 1
        return (
            names.PlainTensorMeta(
                idx, memory_format=maybe_suggest_memory_format(a, with_memory_format)
            ),
            idx,
        )

    inner_keys, ctx = a.__tensor_flatten__()
    next_idx = start_idx
    attrs: dict[str, Any] = {}
    for key in inner_keys:
        value = getattr(a, key)
        if classify_tensor_flatten_attr(a, key, value) == "opaque":
            attrs[key] = OpaqueMeta()
            next_idx += 1
        else:
            attrs[key], next_idx = create_subclass_metadata(
                value, next_idx, count_symints, with_memory_format
            )

    if count_symints:
        next_idx += len(enumerate_filter_symints(a.size()))
        next_idx += len(enumerate_filter_symints(a.stride()))

    return (
        names.SubclassCreationMeta(
            flat_tensor_start_idx=start_idx,
            arg_count=next_idx - start_idx,
            included_subclass_symints=count_symints,
            attrs=attrs,
            meta=ctx,
            outer_size=a.size(),
            outer_stride=a.stride(),
            original_subclass=a,
            memory_format=maybe_suggest_memory_format(a, with_memory_format),
        ),
        next_idx,
    )


def _fakeify_opaque(value: Any) -> Any:
    """Trace time: a registered opaque becomes a FakeScriptObject of the active
    fake mode, so the proxy tracer sees a graph input, not a constant.
    See Note [Opaque attrs in the flat argument list].

    torch 2.13's ``_maybe_fakeify_opaque`` (local to
    ``unwrap_tensor_subclasses``), with the same results: an object that is
    already a FakeScriptObject is returned as is (2.13 gets there because
    ``is_opaque_type(FakeScriptObject)`` is False)."""
    if not compat.is_opaque_attr(value, fake=False):  # not an opaque, or already fake
        return value
    from torch._guards import detect_fake_mode
    from torch._library.fake_class_registry import maybe_to_fake_obj

    fake_mode = detect_fake_mode()
    if fake_mode is None or not compat.is_registered_opaque_type(type(value)):
        return value
    return maybe_to_fake_obj(fake_mode, value)


def unwrap_tensor_subclasses(
    wrapped_args: Sequence[Any],
    wrapped_args_descs: Sequence[Any],
    *,
    append_symints: bool,
) -> tuple[list[Any], list[Any]]:
    """Replaces ``torch._functorch._aot_autograd.subclass_utils.unwrap_tensor_subclasses``
    (torch 2.11.0 backport; 2.13.0 forced).

    Differs from 2.11: a leaf that is a registered opaque is fakeified
    (``_fakeify_opaque``, as 2.13 does), so it becomes a graph input, not a
    constant (2.11 traced the real object). Differs from 2.11 and 2.13: a
    different number of args and descriptors raises ``AssertionError``
    (torch zips them and silently drops the extra ones; its callers always
    pass as many). Note [install() is transparent without opaques]:
    identical (same order and descriptors; ``_fakeify_opaque`` returns any
    non-opaque leaf unchanged). See Note [Opaque attrs in the flat argument
    list] and Note [The runtime and the patch series are one change].

    Trace time: flatten subclass args (and their descriptors): inner
    tensors and opaques in ``__tensor_flatten__`` order, then (with
    ``append_symints``) each subclass's symbolic sizes and strides.
    """
    names = aot()
    xs: list[Any] = []
    descs: list[Any] = []

    def visit(t: Any, desc: Any) -> None:
        if not is_traceable_wrapper_subclass(t):
            xs.append(_fakeify_opaque(t))
            descs.append(desc)
            return
        if isinstance(desc, names.AOTInput):
            get_attr, size, stride = (
                names.SubclassGetAttrAOTInput,
                names.SubclassSizeAOTInput,
                names.SubclassStrideAOTInput,
            )
        else:
            get_attr, size, stride = (
                names.SubclassGetAttrAOTOutput,
                names.SubclassSizeAOTOutput,
                names.SubclassStrideAOTOutput,
            )
        attrs, _ = t.__tensor_flatten__()
        for attr in attrs:
            visit(getattr(t, attr), get_attr(desc, attr))
        if append_symints:
            sizes = enumerate_filter_symints(t.size())
            strides = enumerate_filter_symints(t.stride())
            xs.extend(s for _, s in sizes)
            xs.extend(s for _, s in strides)
            descs.extend(size(desc, i) for i, _ in sizes)
            descs.extend(stride(desc, i) for i, _ in strides)

    if len(wrapped_args) != len(wrapped_args_descs):
        raise AssertionError(
            f"{len(wrapped_args)} args but {len(wrapped_args_descs)} descriptors"
        )
    for x, desc in zip(wrapped_args, wrapped_args_descs):
        visit(x, desc)
    return xs, descs
