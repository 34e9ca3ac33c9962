"""AOTAutogradCache entries are shared between native torch and forced
mode, and between stock torch and install() on a backport torch.

On torch >= 2.12 the cache key of a compiled graph does not depend on
whether ``install(force=True)`` replaced the subclass runtime (the graphs
are the same; the dump suites prove it), so an entry forced mode saved is
loaded by stock torch. The other way, forced mode does not trust an entry
stock torch saved for a graph with opaque inputs: it carries no record of
what tracing read off them (Note [Opaque reads in the AOTAutograd cache]). It must then work: the pickled subclass metadata has
to mean the same thing to both (the ``OpaqueMeta`` marker is torch's own
class; see runtime/meta.py). With a marker class of our own, native torch
loaded a forced-mode entry with the opaque slots dropped and called the
compiled graph with too few inputs.

On a backport torch (2.10, 2.11), install() leaves the key of a graph
without opaques as stock torch computes it, so a training graph stock torch
saved is loaded under install() and runs through the patched runtime: its
pickled ``ViewAndMutationMeta`` predates the backport's fields (on 2.10,
``num_opaque_objects_saved_for_bw``), which must read as "none saved".

Each direction runs two fresh processes over one cache directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import harness

import torch_subclass_rt._torch_compat as compat

MODE = harness.current_mode()

# One process: compile a training step on a MeshTensor with Inductor (the
# backend the AOTAutogradCache serves), run it with a new mesh, report.
_CHILD = r"""
import json, sys
import torch
import torch_subclass_rt as tsrt

mode = sys.argv[1]
if mode == "forced":
    tsrt.install(force=True)
from torch._dynamo.utils import counters
from torch._functorch import config as functorch_config
from torch._inductor import config as inductor_config
from torch_subclass_rt.examples.mesh_tensor import MeshHandle, MeshTensor

def f(x):
    return (x.sin() * 2).cos()

torch.manual_seed(0)
local = torch.randn(6)
with functorch_config.patch(enable_autograd_cache=True), inductor_config.patch(
    {"fx_graph_cache": True, "fx_graph_remote_cache": False}
):
    mesh = MeshHandle("runtime")
    x = MeshTensor(local.clone().requires_grad_(), mesh)
    out = torch.compile(f, backend="inductor", fullgraph=True)(x)
    out.sum().backward()
ref_local = local.clone().requires_grad_()
ref = f(ref_local)
ref.sum().backward()
print(json.dumps({
    "status": repr(tsrt.status()),
    "out_mesh_is_runtime": out.mesh is mesh,
    "grad_mesh_is_runtime": x.grad.mesh is mesh,
    "out_ok": torch.allclose(out._local, ref),
    "grad_ok": torch.allclose(x.grad._local, ref_local.grad),
    "cache": {k: v for k, v in counters["aot_autograd"].items() if "cache" in k},
}))
"""

# One process: compile a training step on a subclass without opaques
# (TwoTensor) with Inductor, stock torch or install(), and report.
_PLAIN_CHILD = r"""
import json, sys
import torch
import torch_subclass_rt as tsrt

if sys.argv[1] == "backport":
    tsrt.install()
from torch._dynamo.utils import counters
from torch._functorch import config as functorch_config
from torch._inductor import config as inductor_config
from torch.testing._internal.two_tensor import TwoTensor

def f(x):
    return (x.sin() * 2).cos()

torch.manual_seed(0)
a, b = torch.randn(6), torch.randn(6)
with functorch_config.patch(enable_autograd_cache=True), inductor_config.patch(
    {"fx_graph_cache": True, "fx_graph_remote_cache": False}
):
    x = TwoTensor(a.clone(), b.clone()).requires_grad_()
    out = torch.compile(f, backend="inductor", fullgraph=True)(x)
    out.sum().backward()
ref_x = TwoTensor(a.clone(), b.clone()).requires_grad_()
ref = f(ref_x)
ref.sum().backward()
print(json.dumps({
    "status": repr(tsrt.status()),
    "out_ok": torch.allclose(out.a, ref.a) and torch.allclose(out.b, ref.b),
    "grad_ok": torch.allclose(x.grad.a, ref_x.grad.a) and torch.allclose(x.grad.b, ref_x.grad.b),
    "cache": {k: v for k, v in counters["aot_autograd"].items() if "cache" in k},
}))
"""


def _run(mode: str, cache_dir: str, child: str = _CHILD) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir)
    env.pop("TSRT_MODE", None)
    proc = subprocess.run(
        [sys.executable, "-c", child, mode],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise AssertionError(f"{mode} process failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@unittest.skipUnless(
    compat.torch_version() in compat.FORCED_VERSIONS,
    f"forced mode exists on torch {', '.join(compat.FORCED_VERSIONS)} only",
)
@unittest.skipIf(
    MODE == "forced",
    "the test starts its own native and forced processes; the native run covers it",
)
class TestCacheAcrossModes(unittest.TestCase):
    def check_pair(self, first: str, second: str) -> None:
        with tempfile.TemporaryDirectory() as cache_dir:
            saved = _run(first, cache_dir)
            loaded = _run(second, cache_dir)
        self.assertEqual(saved["cache"].get("autograd_cache_saved"), 1, saved)
        self.assertEqual(loaded["cache"].get("autograd_cache_hit"), 1, loaded)
        self.assertIn(f"mode={'forced' if second == 'forced' else 'off'!r}", loaded["status"])
        for result in (saved, loaded):
            for check in ("out_mesh_is_runtime", "grad_mesh_is_runtime", "out_ok", "grad_ok"):
                self.assertTrue(result[check], (check, result))

    def test_forced_entry_loaded_natively(self):
        self.check_pair("forced", "native")

    def test_native_entry_not_trusted_forced(self):
        # stock torch saves no record of the opaque member reads its tracing
        # made, so an entry of a graph with opaque inputs it saved cannot be
        # checked against the caller's objects: forced mode (which carries
        # the fix, Note [Opaque reads in the AOTAutograd cache]) compiles
        # once and saves its own
        with tempfile.TemporaryDirectory() as cache_dir:
            saved = _run("native", cache_dir)
            loaded = _run("forced", cache_dir)
            again = _run("forced", cache_dir)
        self.assertEqual(saved["cache"].get("autograd_cache_saved"), 1, saved)
        self.assertEqual(loaded["cache"].get("autograd_cache_hit", 0), 0, loaded)
        self.assertEqual(loaded["cache"].get("autograd_cache_saved"), 1, loaded)
        self.assertEqual(again["cache"].get("autograd_cache_hit"), 1, again)
        for result in (saved, loaded, again):
            for check in ("out_mesh_is_runtime", "grad_mesh_is_runtime", "out_ok", "grad_ok"):
                self.assertTrue(result[check], (check, result))


@unittest.skipUnless(
    compat.torch_version() in compat.BACKPORT_VERSIONS,
    f"install() replaces the runtime of every subclass on torch "
    f"{', '.join(compat.BACKPORT_VERSIONS)} only",
)
class TestCacheAcrossInstall(unittest.TestCase):
    def check_pair(self, first: str, second: str) -> None:
        with tempfile.TemporaryDirectory() as cache_dir:
            saved = _run(first, cache_dir, _PLAIN_CHILD)
            loaded = _run(second, cache_dir, _PLAIN_CHILD)
        self.assertEqual(saved["cache"].get("autograd_cache_saved"), 1, saved)
        self.assertEqual(loaded["cache"].get("autograd_cache_hit"), 1, loaded)
        self.assertIn(f"mode={'backport' if second == 'backport' else 'off'!r}", loaded["status"])
        for result in (saved, loaded):
            for check in ("out_ok", "grad_ok"):
                self.assertTrue(result[check], (check, result))

    def test_stock_entry_loaded_with_install(self):
        self.check_pair("stock", "backport")

    def test_install_entry_loaded_stock(self):
        self.check_pair("backport", "stock")


if __name__ == "__main__":
    unittest.main()
