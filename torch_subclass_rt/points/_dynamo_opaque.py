"""Checks called from the edited torch sources in ``points/dynamo_opaque_inputs.py`` and
``points/guard_state_pickling.py`` (torch 2.11 has no ``OpaqueBase`` match arms there).

The edited functions call them as ``__tsrt__.<name>`` (``_edit_api``).
"""

from __future__ import annotations

from typing import Any

import torch

# is_opaque_attr: imported by name by the edited sources (points/guard_state_pickling.py,
# points/dynamo_opaque_inputs.py); the package's one predicate, re-exported here.
from .._torch_compat import is_opaque_attr, is_reference_opaque_type, unwrap_fake_opaque
from ..runtime import errors


def is_tensor_or_opaque(inner: Any) -> bool:
    return isinstance(inner, torch.Tensor) or is_opaque_attr(inner)


def check_tensor_flatten_attr(subclass: Any, attr: str, inner: Any) -> None:
    """torch 2.12's ``VariableBuilder.wrap_tensor`` validation of flatten attrs.

    Only tensors and reference-type opaques may be flatten attrs: a
    value-type opaque is baked into the graph as a constant, so it cannot
    flow through AOTAutograd's flat inputs the way a subclass attr must.
    """
    if isinstance(inner, torch.Tensor):
        return
    check_tensor_or_opaque(subclass, attr, inner)
    real_type = type(unwrap_fake_opaque(inner))
    if not is_reference_opaque_type(real_type):
        raise errors.not_an_inner_attr_error(subclass, attr, inner)


def check_tensor_or_opaque(subclass: Any, attr: str, inner: Any) -> None:
    """A flatten attr that is neither a tensor nor a registered opaque.

    torch 2.12 fails here with a bare ``AssertionError: expected Tensor or
    OpaqueBase``; we raise the runtime's ``TypeError`` that names the
    subclass, the attr and how to register the type.
    """
    if not is_tensor_or_opaque(inner):
        raise errors.unregistered_object_in_tensor_attrs_error(subclass, attr, inner)


def same_object(obj: Any) -> Any:
    """Unpickle function for an opaque inner attr in Dynamo's guard state:
    the opaque itself is pickled (by its own reduce), and comes back as is.
    Module-level, so pickle stores it by name."""
    return obj
