"""A reference opaque inner attr through Inductor's CUDA-graph trees
(``mode="reduce-overhead"``): one recorded graph serves every mesh, with no
CUDA-graph skip. Needs a CUDA device; skips without one.
"""

from __future__ import annotations

import unittest

import harness  # noqa: F401  (sets the mode under test when run as a script)

import torch
from torch._dynamo.test_case import TestCase


class TestCudagraphTreesOpaque(TestCase):
    @unittest.skipUnless(
        torch.cuda.is_available(),
        "CUDA graphs (mode='reduce-overhead') need a CUDA device; none here",
    )
    def test_opaque_input_through_cudagraph_trees(self):
        # A reference opaque (the mesh handle, a graph input next to the
        # local tensor) in the CUDA-graph tree pipeline (upstream PR 179793:
        # stock 2.11 refused such a graph, "non-Tensor inputs", or copied
        # the opaque like a tensor). It was recorded as that bug on 2.11
        # until run on a GPU: with install() on torch 2.11.0 (H200) it
        # passes, so it is a plain test, on every torch with a GPU.
        from torch._dynamo.utils import counters

        from torch_subclass_rt.examples.mesh_tensor import MeshHandle, MeshTensor

        counters.clear()
        f = torch.compile(lambda x: x.sin() + 1, mode="reduce-overhead", fullgraph=True)
        for name in ("a", "b", "c"):
            mesh = MeshHandle(name)
            local = torch.randn(8, device="cuda")
            out = f(MeshTensor(local, mesh))
            self.assertIs(out.mesh, mesh)
            self.assertEqual(out._local, local.sin() + 1)
        self.assertEqual(counters["inductor"]["cudagraph_skips"], 0)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()

