"""Checks called from the edited torch sources in ``points/dynamo.py`` and
``points/guards.py`` (torch 2.11 has no ``OpaqueBase`` match arms there).

Kept free of module-level torch imports beyond ``torch`` itself so the
edited functions can import it cheaply on every call.
"""

from __future__ import annotations

from typing import Any

import torch

from .._torch_compat import is_opaque_object, is_reference_opaque_type, unwrap_fake_opaque


def is_opaque_attr(inner: Any) -> bool:
    """A flatten attr that is an opaque object (or its FakeScriptObject)."""
    return not isinstance(inner, torch.Tensor) and is_opaque_object(inner)


def is_tensor_or_opaque(inner: Any) -> bool:
    return isinstance(inner, torch.Tensor) or is_opaque_object(inner)


def check_flatten_attr(subclass: Any, attr: str, inner: Any) -> None:
    """torch 2.12's ``VariableBuilder.wrap_tensor`` validation of flatten attrs.

    Only tensors and reference-type opaques may be flatten attrs: a
    value-type opaque is baked into the graph as a constant, so it cannot
    flow through AOTAutograd's flat inputs the way a subclass attr must.
    """
    if isinstance(inner, torch.Tensor):
        return
    if is_opaque_object(inner) and is_reference_opaque_type(type(unwrap_fake_opaque(inner))):
        return
    raise RuntimeError(
        f"{type(inner).__name__!r} found in tensor attrs of "
        f"{type(subclass).__name__}.__tensor_flatten__() (attr {attr!r}). "
        "Only tensors and reference-type opaques are allowed in tensor attrs."
    )
