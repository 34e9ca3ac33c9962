"""``torch.export`` with opaque attrs in ``__tensor_flatten__``.

Torch 2.10 / 2.11 (backport):

Non-strict export builds a symbolic context for every input tensor with
``non_strict_utils._create_symbolic_context_for_tensor``, which recurses into
every attr named by ``__tensor_flatten__`` and reads ``.shape`` off it: an
opaque attr fails with ``'Counter' object has no attribute 'shape'``. Torch
2.12 skips opaque attrs, so the subclass's ``inner_contexts`` holds entries for
its tensor attrs only.

Strict export goes through Dynamo and needs no point here.

Torch 2.12 to 2.14 (native+fixes; issue 179870, code in ``_upstream_fixes``):
serializing and packaging an exported program whose constants include an
opaque object.
"""

from __future__ import annotations

import functools

from .._torch_compat import is_opaque_attr
from ..patching.registry import PatchPoint
from ._versions import ONLY_BACKPORT, upstream_fix
from . import _upstream_fixes

class _OpaqueAttr:
    """Stands in for the context of an opaque attr until the parent strips it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<opaque attr: no symbolic context>"


_OPAQUE_ATTR = _OpaqueAttr()


def _build_create_symbolic_context_for_tensor(original):
    """Wraps ``_export.non_strict_utils._create_symbolic_context_for_tensor``
    (torch 2.11.0): sentinel-then-strip, no copy of its code.

    The function recurses through its module global, which is this wrapper
    once installed. So the recursive call for an opaque attr lands here and
    answers a sentinel instead of reading ``.shape``; when the parent's
    context comes back, the sentinel entries are removed from its
    ``inner_contexts`` (a plain dict), leaving exactly what 2.12+ builds.
    Everything else is the original code, untouched.
    Note [install() is transparent without opaques]: delegation (without opaques no
    sentinel is made or stripped; the original's result is returned as is).
    """

    @functools.wraps(original)
    def _create_symbolic_context_for_tensor(t, source, t_constraints, sources, mode):
        if is_opaque_attr(t):
            return _OPAQUE_ATTR
        context = original(t, source, t_constraints, sources, mode)
        inner = getattr(context, "inner_contexts", None)
        if inner:
            for attr in [a for a, c in inner.items() if c is _OPAQUE_ATTR]:
                del inner[attr]
        return context

    return _create_symbolic_context_for_tensor


_SERDE_FIX = "issue 179870 (open; PR 181676 unmerged)"
#: value opaques reach torch.export from 2.12 on; 2.11 has nothing to save
_SERDE_NO_SERIES = (
    "torch.export of a value opaque passed to a graph node needs torch >= 2.12, "
    "so the point does not apply to 2.11.0 and the v2.11.0 series has no counterpart"
)
_SERDE_TESTS = (
    "test/points/test_upstream_fixes.py::TestUpstreamFixes::test_export_save_load_opaque_constant",
)


#: what the three export points of issue 179870 share: one fix, one set of
#: releases, one test that guards each
_SERDE_POINT = dict(
    upstream_fix=_SERDE_FIX,
    series_none=_SERDE_NO_SERIES,
    guarded_by=_SERDE_TESTS,
    **upstream_fix("2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1"),
)


POINTS = [
    PatchPoint(
        name="export.create_symbolic_context_for_tensor",
        target="torch._export.non_strict_utils:_create_symbolic_context_for_tensor",
        series=("0004 torch/_export/non_strict_utils.py::_create_symbolic_context_for_tensor",),
        build=_build_create_symbolic_context_for_tensor,
        reason="non-strict export: no symbolic context for opaque attrs of a "
        "subclass input (2.11 reads .shape off them)",
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_export_non_strict_with_opaque_attrs_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="export.GraphModuleSerializer.serialize_input.opaque_constant",
        target="torch._export.serde.serialize:GraphModuleSerializer.serialize_input",
        build=_upstream_fixes._build_serialize_opaque_constant_input,
        reason="a value opaque passed to a graph node could not be serialized (2.12.x) "
        "or was left out of the saved archive (2.13.0, 2.14.x)",
        **_SERDE_POINT,
    ),
    PatchPoint(
        name="export._package_exported_programs.opaque_constant",
        target="torch.export.pt2_archive._package:_package_exported_programs",
        build=_upstream_fixes._build_package_opaque_constants,
        reason="torch.export.save dropped the value opaques a graph passes to its nodes",
        **_SERDE_POINT,
    ),
    PatchPoint(
        name="export._load_exported_programs.opaque_constant",
        target="torch.export.pt2_archive._package:_load_exported_programs",
        build=_upstream_fixes._build_load_opaque_constants,
        reason="torch.export.load could not read the value opaques saved by the point above",
        **_SERDE_POINT,
    ),
]
