"""Opaque attrs of a subclass, carried from ``describe_tensor`` to ``meta_tensor``.

torch 2.12 added a field ``MetaTensorDesc.opaque_attrs``. Adding a field to
2.11's frozen dataclass from outside would mean rebuilding the class (every
``isinstance`` and annotation in torch refers to the old one), so instead the
edited ``describe_tensor`` stores the opaques in the *instance* ``__dict__`` of
the desc it built (``object.__setattr__`` bypasses the frozen check; the
dataclass fields, ``__eq__``, ``as_json`` and ``dataclasses.replace`` never see
it), and the edited ``meta_tensor`` reads them back. A desc carries its own
opaques, so nothing is shared between threads and nothing outlives the desc.

These functions are called from edited torch source (see
``points/fake_tensors.py``) as ``__tsrt__.<name>`` (``_edit_api``); they import nothing
from torch at module level.
"""

from __future__ import annotations

from typing import Any

from .._torch_compat import is_opaque_attr, unwrap_fake_opaque
from ..runtime import errors

#: instance attribute on a MetaTensorDesc (private: not a dataclass field)
_SLOT = "_tsrt_opaque_attrs"


def describe_flatten_attrs(
    describer: Any, t: Any, raw_attrs: list[str], trace: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tensor attr -> MetaTensorDesc, opaque attr -> real opaque object).

    Mirrors torch 2.12's ``describe_tensor``: tensors are described
    recursively, opaques are kept as the real object (a FakeScriptObject is
    unwrapped, so re-fakeifying a fake subclass keeps the identity of the
    object), anything else is the runtime's TypeError naming the attr.
    """
    import torch

    attrs: dict[str, Any] = {}
    opaques: dict[str, Any] = {}
    for attr in raw_attrs:
        inner = getattr(t, attr)
        if isinstance(inner, torch.Tensor):
            attrs[attr] = describer.describe_tensor(inner, trace=trace)
        elif is_opaque_attr(inner):
            opaques[attr] = unwrap_fake_opaque(inner)
        else:
            raise errors.unregistered_object_in_tensor_attrs_error(t, attr, inner)
    return attrs, opaques


def attach(desc: Any, opaques: dict[str, Any]) -> None:
    if opaques:
        object.__setattr__(desc, _SLOT, opaques)


def opaque_attrs_of(desc: Any) -> dict[str, Any]:
    """The opaque attrs ``describe_tensor`` recorded on ``desc`` (may be empty)."""
    return desc.__dict__.get(_SLOT) or {}
