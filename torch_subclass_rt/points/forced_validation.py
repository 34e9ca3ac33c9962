"""Forced mode's check of a subclass input's flatten attrs.

Forced mode only (torch 2.13): no series commit; the backport gets the same
check from ``dynamo_opaque_inputs``' ``wrap_tensor`` edit (series 0003).

Releases and modes: 2.13.0 (forced).
Series commits: none.
Upstream: none (not an upstream fix).

Clear errors for bad flatten attrs in forced mode (torch 2.13).

Native 2.13 first looks at a subclass input's flatten attrs in
``VariableBuilder.wrap_tensor`` -> ``is_fake``, which fails on an
unregistered object with an internal ``AssertionError: expected Tensor or
OpaqueBase, got <class ...>`` naming neither the subclass nor the attribute.
In forced mode we check the attrs first and raise the runtime's errors (the
backport gets the same check from its ``dynamo.VariableBuilder.wrap_tensor``
source edit, which sits where 2.12 validates).
"""

from __future__ import annotations

import functools

from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..patching.registry import PatchPoint
from ._dynamo_opaque import check_tensor_flatten_attr
from ._versions import ONLY_FORCED


def _validate_then_wrap(original):
    """build(): wraps ``torch._dynamo.variables.builder.VariableBuilder.wrap_tensor``
    (torch 2.13.0, forced mode only). Differs from 2.13: a subclass input's
    flatten attrs (recursively) are checked first, so a value opaque or an
    unregistered object gets the runtime's error naming the subclass and
    the attr (module docstring). Note [install() is transparent without
    opaques]: delegation (after a check that passes every tensor attr; the
    named exception otherwise)."""
    @functools.wraps(original)
    def wrap_tensor(self, value):
        if is_traceable_wrapper_subclass(value):
            _check_subclass(value)
        return original(self, value)

    return wrap_tensor


def _check_subclass(value) -> None:
    attrs, _ = value.__tensor_flatten__()
    for attr in attrs:
        inner = getattr(value, attr)
        check_tensor_flatten_attr(value, attr, inner)
        if is_traceable_wrapper_subclass(inner):
            _check_subclass(inner)


POINTS = [
    PatchPoint(
        name="dynamo.VariableBuilder.wrap_tensor.validate_attrs",
        target="torch._dynamo.variables.builder:VariableBuilder.wrap_tensor",
        build=_validate_then_wrap,
        reason="name the subclass and attr of an unregistered flatten attr "
        "(2.13 raises an internal AssertionError)",
        series_none="forced mode only: on 2.11 the same check is part of "
        "dynamo.VariableBuilder.wrap_tensor (series 0003, _check_tensor_flatten_attr)",
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_unregistered_object_in_tensor_attrs_errors_cpu",
        ),
        **ONLY_FORCED,
    ),
]
