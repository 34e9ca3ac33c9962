"""A value opaque output next to a subclass output stays a constant (upstream PR 193190).

Upstream PR 193190, carried into the native releases that lack it
(native+fixes, forced); torch 2.11 with the backport does not have the bug.
See Note [Upstream fixes] in ``points/__init__.py``.

Releases and modes: 2.12.0, 2.12.1, 2.13.0, 2.14.0, 2.14.1 (forced,
    native+fixes).
Series commits: none.
Upstream: PR 193190.
"""

from __future__ import annotations

import functools

from .._torch_compat import is_value_opaque_type
from ..patching.registry import PatchPoint
from ._versions import upstream_fix


def _build_value_opaque_outputs_stay_constants(original):
    @functools.wraps(original)
    def unwrap_tensor_subclasses(wrapped_args, *args, **kwargs):
        """Stands in for ``subclass_utils.unwrap_tensor_subclasses`` (torch
        2.12.x, 2.13.0, 2.14.x; in forced mode it wraps our runtime's copy).

        Differs: a value-type opaque among the values to flatten (a plain
        graph output next to a subclass output) stays the real object.
        Those releases turn every registered opaque into a FakeScriptObject
        here, which is right for reference opaques (graph inputs) but makes a
        value opaque an untracked constant: the graph returns it through a
        ``get_attr`` of a FakeScriptObject, which Python code then sees
        (corrupted) and which an FX-graph-cache entry stores as None (lost
        on a cache hit). Kept real, it is printed into the graph as the
        constant it is (upstream PR 193190).
        """
        from torch._library.fake_class_registry import FakeScriptObject

        values = {
            id(v): v
            for v in wrapped_args
            if not isinstance(v, FakeScriptObject)
            and is_value_opaque_type(type(v))
        }
        result = original(wrapped_args, *args, **kwargs)
        if not values:
            return result

        def keep_real(x):
            if isinstance(x, FakeScriptObject):
                real = object.__getattribute__(x, "real_obj")
                if values.get(id(real)) is real:
                    return real
            return x

        if isinstance(result, tuple):  # (flat args, descriptors) on >= 2.12
            return ([keep_real(x) for x in result[0]], *result[1:])
        return [keep_real(x) for x in result]

    return unwrap_tensor_subclasses


POINTS = [
    PatchPoint(
        name="aot_autograd.unwrap_tensor_subclasses.value_opaque_output",
        target="torch._functorch._aot_autograd.subclass_utils:unwrap_tensor_subclasses",
        build=_build_value_opaque_outputs_stay_constants,
        reason="a value opaque output next to a subclass output became a FakeScriptObject "
        "constant (None after an FX-graph-cache hit)",
        upstream_fix="PR 193190",
        series_none="torch 2.11 with the backport (or the series) does not have this bug "
        "(test/points/test_value_opaque_outputs.py: broken on 2.12.x, 2.13.0, 2.14.x), so the point "
        "does not apply to 2.11.0 and the v2.11.0 series does not carry the fix",
        rebinds=(
            "torch._functorch.aot_autograd",
            "torch._functorch._aot_autograd.graph_capture_wrappers",
        ),
        guarded_by=(
            "test/points/test_value_opaque_outputs.py::TestValueOpaqueOutputs::test_opaque_constant_with_subclass_output_cache_hit",
            "test/points/test_value_opaque_outputs.py::TestValueOpaqueOutputs::test_value_type_graph_output_subclass_metadata_side_effect",
        ),
        **upstream_fix("2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1"),
    ),
]
