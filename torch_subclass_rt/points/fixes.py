"""Later upstream fixes for opaque objects in subclasses, carried into the
releases that lack them.

Native torch 2.12.1 / 2.13.0 / 2.14.1 support opaque attrs in
``__tensor_flatten__`` but shipped bugs in the feature that upstream fixed
only later. ``install()`` on those releases applies exactly the points below
that list the release (mode "native+fixes"); forced mode on 2.13.0 carries
them too, and where the bug is also in the 2.11 backport the point lists
2.11.0 (mode "backport") and the patch series carries the same fix.

Each point is a wrapper that handles the one case the fix is about and
delegates everything else to the function it wraps, so it also stacks on
the 2.11 backport's own replacement of the same function (see
``registry.plan``). ``upstream_fix`` names the upstream PR; the test that
reproduces the bug on every affected release is in
``test/test_upstream_fixes.py``.

Issue 187041 (a value opaque that is subclass metadata and is also stored
through a side effect reaches the side effect as a FakeScriptObject;
2.12.1, 2.13.0) has no point of its own. Upstream's PR 187057 unwraps the
FakeScriptObject in Dynamo's bytecode codegen. On these releases that
object only exists because AOTAutograd turned the value opaque into a
FakeScriptObject constant next to a subclass output, which the PR 193190
point below prevents; with it applied, a codegen point receives no
FakeScriptObject in any case we could build, so no test would fail
without it, and it is not carried. The issue's test is guarded by the
193190 point.
"""

from __future__ import annotations

import functools

from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .._torch_compat import is_value_opaque_type
from ..patching.registry import PatchPoint
from ._versions import upstream_fix

_MISSING = object()


def _build_callable_value_opaque_getattr(original):
    @functools.wraps(original)
    def dynamic_getattr(self, tx, name):
        """Stands in for ``TensorVariable.dynamic_getattr`` (torch 2.12.1,
        2.13.0, 2.14.1; on 2.11.0 it wraps the backport's edited copy).

        Differs: an attribute of an intermediate subclass (no source) that is
        a *callable* value-type opaque (a quantizer with ``__call__``) is
        built like a non-callable one, as a constant opaque variable whose
        methods can be called (upstream PR 188799). Those releases only
        accept non-callable metadata there, so ``y.q.method()`` graph-broke.
        """
        if not self.source:
            fake_val = self.proxy.node.meta.get("example_value")
            if is_traceable_wrapper_subclass(fake_val):
                attrs, _ctx = fake_val.__tensor_flatten__()
                if name not in attrs:
                    value = getattr(fake_val, name, _MISSING)
                    if (
                        value is not _MISSING
                        and callable(value)
                        and is_value_opaque_type(type(value))
                    ):
                        from torch._dynamo.variables.base import VariableTracker

                        return VariableTracker.build(tx, value)
        return original(self, tx, name)

    return dynamic_getattr


def _build_value_opaque_outputs_stay_constants(original):
    @functools.wraps(original)
    def unwrap_tensor_subclasses(wrapped_args, *args, **kwargs):
        """Stands in for ``subclass_utils.unwrap_tensor_subclasses`` (torch
        2.12.1, 2.13.0, 2.14.1; in forced mode it wraps our runtime's copy).

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
        name="fix.TensorVariable.dynamic_getattr.callable_value_opaque",
        target="torch._dynamo.variables.tensor:TensorVariable.dynamic_getattr",
        build=_build_callable_value_opaque_getattr,
        reason="a callable value opaque on an intermediate subclass graph-broke on method access",
        upstream_fix="PR 188799 (issue 188796)",
        series=("0010 torch/_dynamo/variables/tensor.py::TensorVariable.dynamic_getattr",),
        guarded_by=(
            "test/test_upstream_fixes.py::TestUpstreamFixes::test_tensor_subclass_with_callable_opaque_attr",
        ),
        **upstream_fix("2.11.0", "2.12.1", "2.13.0", "2.14.1"),
    ),
    PatchPoint(
        name="fix.unwrap_tensor_subclasses.value_opaque_output",
        target="torch._functorch._aot_autograd.subclass_utils:unwrap_tensor_subclasses",
        build=_build_value_opaque_outputs_stay_constants,
        reason="a value opaque output next to a subclass output became a FakeScriptObject "
        "constant (None after an FX-graph-cache hit)",
        upstream_fix="PR 193190",
        series_none="torch 2.11 with the backport (or the series) does not have this bug "
        "(test/test_upstream_fixes.py: broken on 2.12.1, 2.13.0, 2.14.1), so the point "
        "does not apply to 2.11.0 and the v2.11.0 series does not carry the fix",
        rebinds=(
            "torch._functorch.aot_autograd",
            "torch._functorch._aot_autograd.graph_capture_wrappers",
        ),
        guarded_by=(
            "test/test_upstream_fixes.py::TestUpstreamFixes::test_opaque_constant_with_subclass_output_cache_hit",
            "test/test_upstream_fixes.py::TestUpstreamFixes::test_value_type_graph_output_subclass_metadata_side_effect",
        ),
        **upstream_fix("2.12.1", "2.13.0", "2.14.1"),
    ),
]
