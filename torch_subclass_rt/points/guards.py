"""Dynamo's guards (``torch._dynamo.guards``) on opaques: the guard-state
pickler (caching compiled guards) and 2.11's ``guard_fn`` guard for torch
2.10 (``GuardBuilder.OPAQUE_OBJ_GUARD_FN_MATCH``).
"""

from __future__ import annotations

from ..patching.registry import PatchPoint
from ..patching.source_edit import Edit, edited_function
from ._versions import ONLY_2_10, ONLY_BACKPORT
from . import _opaque_members


def _build_guards_state_reducer_override(original):
    """``torch._dynamo.guards.GuardsStatePickler.reducer_override`` (torch
    2.11.0) with one edit.

    Pickling Dynamo's guard state (precompile / ``caching_precompile``)
    reduces a subclass input by calling ``reducer_override`` on each inner
    attr and storing ``(attr, func, args)``; for an opaque it answers
    ``NotImplemented`` ("pickle it the normal way"), which 2.11 unpacked as a
    pair: ``TypeError: cannot unpack non-iterable NotImplementedType
    object``. Torch 2.12 stores the inner value itself and lets pickle reduce
    it; here the opaque is stored behind an identity unpickle function, which
    keeps 2.11's (attr, func, args) layout for every tensor attr.
    """
    return edited_function(
        original,
        [
            Edit(
                """
                func, args_tuple = self.reducer_override(inner)
                inner_data.append((attr, func, args_tuple))
                """,
                """
                if __tsrt__.is_opaque_attr(inner):
                    inner_data.append((attr, __tsrt__.same_object, (inner,)))
                    continue
                func, args_tuple = self.reducer_override(inner)
                inner_data.append((attr, func, args_tuple))
                """,
            ),
        ],
    )


POINTS = [
    PatchPoint(
        name="guards.GuardBuilder.OPAQUE_OBJ_GUARD_FN_MATCH",
        target="torch._dynamo.guards:GuardBuilder.OPAQUE_OBJ_GUARD_FN_MATCH",
        build=lambda _original: _opaque_members.OPAQUE_OBJ_GUARD_FN_MATCH,
        new_attribute=True,
        reason="guard a reference opaque on its guard_fn values (torch 2.11)",
        series=("0000 torch/_dynamo/guards.py::GuardBuilder.OPAQUE_OBJ_GUARD_FN_MATCH",),
        guarded_by=(f"{_opaque_members._MEMBERS_TEST}::test_other_dim_names_recompile_cpu",),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="guards.GuardsStatePickler.reducer_override",
        target="torch._dynamo.guards:GuardsStatePickler.reducer_override",
        build=_build_guards_state_reducer_override,
        reason="guard-state pickling unpacked NotImplemented for an opaque inner attr",
        # the series stores the opaque itself and teaches the unpickler to
        # take it; the point keeps 2.11's layout (see its builder)
        series=(
            "0008 torch/_dynamo/guards.py::GuardsStatePickler.reducer_override",
            "0008 torch/_dynamo/guards.py::GuardsStatePickler._unpickle_traceable_wrapper_subclass",
        ),
        guarded_by=(
            "test/runtime/test_opaque_subclass_parity.py::TestOpaqueSubclassParityCPU"
            "::test_guard_pickle_subclass_with_opaque_inner_attr_cpu",
        ),
        **ONLY_BACKPORT,
    ),
]
