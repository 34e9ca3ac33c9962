"""Upstream PR 193190 (points/value_opaque_outputs.py): a value opaque built
in the graph and returned, or stored through a side effect, next to a
subclass output stays the real object, on a cold compile and from the FX
graph cache.

Each test is marked :func:`harness.upstream_bug`: in mode ``native`` on a
release that has the bug it must fail (xfail); with ``install()`` or the
patch series it must pass (points/__init__.py, Note [Upstream fixes]).
Test names follow the upstream tests of the same cases.
"""

from __future__ import annotations

import unittest

import harness
from fixtures import MetaTensor, QuantConfig
import fixtures

import torch
from torch._dynamo.test_case import TestCase

fixtures.register_context_opaques()
NATIVE = harness.torch_major_minor() >= (2, 12)


class TestValueOpaqueOutputs(TestCase):
    @unittest.skipUnless(
        NATIVE,
        "needs value opaques as Dynamo graph outputs (upstream PR 177560, torch "
        ">= 2.12), which 2.11 lacks and the backport does not carry",
    )
    @harness.upstream_bug(
        "PR 193190 (on these releases; upstream also PR 187057, issue 187041)",
        broken_on=("2.12.0", "2.12.1", "2.13.0"),
        fails_with=(AssertionError,),
        # the stored object is the graph's fake, not the real one
        match=r"FakeScriptObject'> is not <class '[\w.]*QuantConfig'>",
    )
    def test_value_type_graph_output_subclass_metadata_side_effect(self):
        # A value opaque created in the graph is both subclass metadata and
        # stored through a side effect: the stored object must be the real
        # one (the buggy releases replay the graph's FakeScriptObject).
        store = {}

        def f(x):
            cfg = QuantConfig("int8")
            store["cfg"] = cfg
            return MetaTensor(x, cfg) * 2

        out = torch.compile(f, backend="aot_eager", fullgraph=True)(torch.ones(3))
        self.assertIsInstance(out, MetaTensor)
        self.assertEqual(out._data, torch.full((3,), 2.0))
        # type(), not isinstance: a FakeScriptObject passes isinstance checks
        # against the opaque class it wraps
        self.assertIs(type(out._meta), QuantConfig)
        self.assertIs(type(store["cfg"]), QuantConfig)
        self.assertEqual(store["cfg"], QuantConfig("int8"))

    @unittest.skipUnless(
        NATIVE,
        "needs value opaques as Dynamo graph outputs (upstream PR 177560, torch "
        ">= 2.12), which 2.11 lacks and the backport does not carry",
    )
    @harness.upstream_bug(
        "PR 193190", broken_on=("2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1"),
        fails_with=(AssertionError,),
        # a FakeScriptObject on a cold compile, None from the FX graph cache
        match=r"(FakeScriptObject|NoneType)'> is not <class '[\w.]*QuantConfig'>",
    )
    def test_opaque_constant_with_subclass_output_cache_hit(self):
        # A value opaque made in the graph is returned next to a subclass
        # output. The buggy releases turn it into a FakeScriptObject constant
        # of the AOT graph: Python gets that object on a cold compile (2.12,
        # 2.13) and None once the FX graph cache serves the graph (all three).
        from torch._inductor import utils as inductor_utils

        fresh_cache = getattr(inductor_utils, "fresh_cache", None) or (
            inductor_utils.fresh_inductor_cache
        )

        def f(x):
            cfg = QuantConfig("fp8")
            return MetaTensor(x, cfg) + 1, cfg

        with fresh_cache():
            for run in ("cold", "fx-graph-cache hit"):
                torch._dynamo.reset()
                out, cfg = torch.compile(f, backend="inductor", fullgraph=True)(
                    torch.ones(3)
                )
                self.assertIs(type(cfg), QuantConfig, run)
                self.assertEqual(cfg, QuantConfig("fp8"))
                self.assertIsInstance(out, MetaTensor)
                self.assertEqual(out._data, torch.full((3,), 2.0))
                self.assertEqual(out._meta, QuantConfig("fp8"))

if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
