"""A ProcessGroup inner attr as a functional collective's group
(points/fake_process_group_isinstance.py; series 0027).

A wrapper subclass written as users write a sharded tensor: its local data
and the ProcessGroup it is sharded over (``["a", "pg"]``), no ``__repr__``
of its own. ``funcol.all_reduce(..., x.pg)`` in the compiled function:
native 2.13 traces one graph; 2.10 / 2.11 + ``install()`` raised
"Unsupported group type: <class '...FakeScriptObject'>" inside Dynamo (the
collective's ``isinstance(group, ProcessGroup)`` was False on the fake) and
fell back to eager. One process, a world-size-1 gloo group.
"""

from __future__ import annotations

import unittest

import fixtures
import harness

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch._dynamo.test_case import TestCase
from torch._dynamo.testing import CompileCounterWithBackend

# registers DeviceMesh and ProcessGroup on torch >= 2.12
import torch.distributed.tensor  # noqa: F401
from torch.distributed.device_mesh import DeviceMesh

if not harness.HAS_OPAQUE_MEMBERS:
    raise unittest.SkipTest(
        "a ProcessGroup as an opaque inner attr builds on opaque members (torch >= 2.11, "
        "or install() on torch 2.10)"
    )


# local data and the process group it is sharded over (["a", "pg"])
Sharded = fixtures.local_and_opaque("Sharded", "pg")


class TestFakeProcessGroupIsinstance(TestCase):
    def setUp(self):
        super().setUp()
        harness.setup_mode()
        torch._dynamo.reset()

    def tearDown(self):
        torch._dynamo.reset()
        super().tearDown()

    def _compile(self, fn, backend="aot_eager"):
        self.counter = CompileCounterWithBackend(backend)
        return torch.compile(fn, backend=self.counter, fullgraph=True)

    @fixtures.process_group_bug()
    def test_all_reduce_over_process_group_attr(self):
        def f(x):
            return funcol.all_reduce(torch.mm(x.a, x.a).sum(), "sum", x.pg) + 1

        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm.code)
            return gm.forward

        compiled = self._compile(f, backend=backend)
        first, second = fixtures.new_group(), fixtures.new_group()
        for pg in (first, second, first):
            x = Sharded(torch.randn(3, 3), pg)
            self.assertEqual(compiled(x), f(x))
        # one graph per group, as native 2.13 traces it: the collective's
        # group name is a constant of the graph, so the graph runs on the
        # group it was traced for (a graph break would trace none)
        self.assertEqual(self.counter.frame_count, 2)
        for pg, code in zip((first, second), graphs):
            self.assertIn("all_reduce", code)
            self.assertIn(repr(pg.group_name), code)

    @fixtures.process_group_bug()
    def test_isinstance_of_process_group_attr(self):
        def f(x):
            is_pg = isinstance(x.pg, dist.ProcessGroup)
            is_mesh = isinstance(x.pg, (DeviceMesh, str))
            return x.a * (2 if is_pg else 3) + (10 if is_mesh else 0)

        compiled = self._compile(f, backend="eager")
        x = Sharded(torch.ones(2), fixtures.new_group())
        self.assertEqual(compiled(x), torch.full((2,), 2.0))
        self.assertEqual(self.counter.frame_count, 1)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
