"""A callable value opaque on an intermediate subclass (upstream PR 188799).

Upstream PR 188799 (issue 188796), carried into torch 2.11 (backport,
series patch 0010) and the native releases that lack it (native+fixes,
forced). See Note [Upstream fixes] in ``points/__init__.py``.

Releases and modes: 2.11.0, 2.12.0, 2.12.1, 2.13.0, 2.14.0, 2.14.1
    (backport, forced, native+fixes).
Series commits:
    patches/v2.11.0/0010-dynamo-Build-a-callable-value-type-opaque-on-a-subcl.patch.
Upstream: PR 188799 (issue 188796).
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
        """Stands in for ``TensorVariable.dynamic_getattr`` (torch 2.12.x,
        2.13.0, 2.14.x; on 2.11.0 it wraps the backport's edited copy).

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


POINTS = [
    PatchPoint(
        name="dynamo.TensorVariable.dynamic_getattr.callable_value_opaque",
        target="torch._dynamo.variables.tensor:TensorVariable.dynamic_getattr",
        build=_build_callable_value_opaque_getattr,
        reason="a callable value opaque on an intermediate subclass graph-broke on method access",
        upstream_fix="PR 188799 (issue 188796)",
        series=("0010 torch/_dynamo/variables/tensor.py::TensorVariable.dynamic_getattr",),
        guarded_by=(
            "test/points/test_callable_value_opaque.py::TestCallableValueOpaque::test_tensor_subclass_with_callable_opaque_attr",
        ),
        **upstream_fix("2.11.0", "2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1"),
    ),
]
