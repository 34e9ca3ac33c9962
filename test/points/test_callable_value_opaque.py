"""Upstream PR 188799 (issue 188796; points/callable_value_opaque.py, series
0010): a method of a *callable* value opaque read off an intermediate
subclass (one with no source) is traced, as non-callable metadata already
was.

The fix test is marked :func:`harness.upstream_bug`: in mode ``native`` on a
release that has the bug it must fail (xfail); with ``install()`` or the
patch series it must pass (points/__init__.py, Note [Upstream fixes]).
Test names follow the upstream tests of the same cases.
"""

from __future__ import annotations


import harness
from fixtures import MetaTensor, QuantConfig, Quantizer
import fixtures

import torch
import torch._dynamo.exc
from torch._dynamo.test_case import TestCase

fixtures.register_context_opaques()
NATIVE = harness.torch_major_minor() >= (2, 12)


class TestCallableValueOpaque(TestCase):
    @harness.upstream_bug(
        "PR 188799 (issue 188796)", broken_on=("2.11.0", "2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1"),
        fails_with=(torch._dynamo.exc.Unsupported,),
        # 2.14.0 breaks a step earlier, on y._meta itself (python_type())
        match=r"Unsupported method call.*get_num_buffers"
        r"|GetAttrVariable\(TensorVariable\(\), _meta\) does not implement python_type",
    )
    @harness.needs_opaque_members
    @harness.needs_value_opaque_members
    def test_tensor_subclass_with_callable_opaque_attr(self):
        # Calling a method of a callable value opaque read off an
        # intermediate subclass (no source) graph-broke: only non-callable
        # metadata was accepted there.
        def f(x):
            y = x * 2
            return y._data * y._meta.get_num_buffers()

        x = MetaTensor(torch.ones(3), Quantizer(3))
        out = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
        self.assertEqual(out, torch.full((3,), 6.0))

    @harness.needs_opaque_members
    @harness.needs_value_opaque_members
    def test_non_callable_value_opaque_attr_still_works(self):
        # The control case of the one above: every release handles it, and
        # the fix must not change it.
        def f(x):
            y = x * 2
            return y._data * len(y._meta.tag)

        x = MetaTensor(torch.ones(3), QuantConfig("abcd"))
        out = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
        self.assertEqual(out, torch.full((3,), 8.0))

if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
