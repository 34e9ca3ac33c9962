"""FX-graph cache with a reference opaque that cannot be pickled (a handle
holding a lock, like one holding a process group).

torch 2.11 pickles the opaque's real object into the cache key, so such a
compile bypassed the cache; with the backport the key names the opaque's
type, so the compile is cached and a later compile with another handle hits.
"""

from __future__ import annotations

import threading
import unittest

import torch
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from torch._inductor.test_case import TestCase
from torch._inductor.utils import fresh_inductor_cache

from harness import current_mode

from torch_subclass_rt.examples.mesh_tensor import MeshHandle, MeshTensor
import torch_subclass_rt as tsrt

MODE = current_mode()


class LockedHandle(MeshHandle):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.lock = threading.Lock()  # makes the handle unpicklable


tsrt.register_opaque(LockedHandle, typ="reference")


@unittest.skipIf(current_mode() != "backport", "the cache-key point is backport-only; "
                 "torch >= 2.12 keeps its own keying of opaques")
class TestInductorCacheKeyWithOpaque(TestCase):
    @inductor_config.patch({"fx_graph_cache": True, "fx_graph_remote_cache": False})
    def test_unpicklable_reference_opaque_is_cached(self):
        def f(x):
            return x.sin() + 1

        with fresh_inductor_cache():
            counters.clear()
            h1 = LockedHandle("one")
            out = torch.compile(f, backend="inductor", fullgraph=True)(
                MeshTensor(torch.randn(4), h1)
            )
            self.assertIs(out.mesh, h1)
            self.assertEqual(counters["inductor"]["fxgraph_cache_bypass"], 0)
            self.assertEqual(counters["inductor"]["fxgraph_cache_miss"], 1)

            torch._dynamo.reset()
            h2 = LockedHandle("two")
            x = torch.randn(4)
            out = torch.compile(f, backend="inductor", fullgraph=True)(MeshTensor(x, h2))
            self.assertEqual(counters["inductor"]["fxgraph_cache_hit"], 1)
            self.assertIs(out.mesh, h2)
            torch.testing.assert_close(out._local, x.sin() + 1)


if __name__ == "__main__":
    from torch._inductor.test_case import run_tests

    run_tests()
