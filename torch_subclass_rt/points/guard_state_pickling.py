"""Dynamo's guard-state pickling of a subclass with an opaque inner attr.

Series patch 0008 ("Guard-state pickling and returned value-opaque ...";
its ``PyCodegen.__call__`` share is ``dynamo_opaque_inputs``).

Releases and modes: 2.10.0, 2.11.0 (backport).
Series commits:
    patches/v2.10.0/0008-dynamo-Guard-state-pickling-and-returned-value-opaqu.patch.
Upstream: none (not an upstream fix).
"""

from __future__ import annotations

from ..patching.registry import PatchPoint
from ..patching.source_edit import Edit, edited_function
from ._versions import ONLY_BACKPORT


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
