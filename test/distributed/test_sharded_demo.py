"""A real sharded tensor over real (gloo) process groups.

* the 2-rank demo (``python -m torch_subclass_rt demo``): inductor-compiled
  training on a batch-sharded ``ShardTensor``, checked against eager and a
  single-process reference, then a fresh process group with no recompile;
* the "before" picture: the same subclass with the mesh handle in the
  flatten *context* recompiles per mesh, the opaque-attr one compiles once;
* a rank raising inside the compiled step fails the run promptly with its
  error, and no child is left behind;
* the same on CUDA tensors (gloo), where a GPU is available.

Runs in the mode named by TSRT_MODE (see harness.py); the spawned ranks use
the same mode.
"""

from __future__ import annotations

import multiprocessing
import time

import fixtures
import harness
import pytest

import torch
import torch.distributed as dist
from torch._dynamo.testing import CompileCounterWithBackend

import torch_subclass_rt as tsrt

from torch_subclass_rt.demo import (
    DemoConfig,
    DemoFailure,
    _MLP,
    _step,
    format_report,
    run_ranks,
)
from torch_subclass_rt.examples.sharded import (
    MeshHandle,
    ShardTensor,
    collective_calls,
    device_mesh_type,
    local_chunk,
)

MODE = harness.current_mode()
#: DeviceMesh as an opaque inner attr builds on opaque members (torch
#: >= 2.11, or torch 2.10 with install())
NEEDS_DEVICE_MESH_OPAQUE = pytest.mark.skipif(
    not harness.HAS_OPAQUE_MEMBERS,
    reason="DeviceMesh as an opaque inner attr needs opaque members (torch >= 2.11, "
    "or install() on 2.10); the demo's default --mesh handle runs here",
)

# the whole run, spawn + compile included; a cold Inductor compile of the
# forward and backward takes about a minute per rank on a 2-core machine
DEMO_TIMEOUT = 400.0


def _no_children_left() -> None:
    left = multiprocessing.active_children()
    assert not left, f"children left running: {left}"


def _check_results(cfg: DemoConfig, results) -> None:
    print(format_report(cfg, results))
    assert [r["compiles"] for r in results] == [1] * cfg.world_size
    assert max(r["max_err"] for r in results) <= 1e-4
    for r in results:
        assert f"mode={MODE!r}" in r["status"], r["status"]
    _no_children_left()


def test_two_rank_gloo_demo_inductor():
    cfg = DemoConfig(mode=MODE, backend="inductor", steps=2, steps_second_mesh=2)
    _check_results(cfg, run_ranks(cfg, timeout=DEMO_TIMEOUT))


def test_rank_error_in_compiled_step_fails_promptly():
    # rank 1's collective raises inside the compiled step (after one good
    # step); rank 0 is then stuck in that collective and must be terminated
    cfg = DemoConfig(
        mode=MODE, backend="aot_eager", steps=2, steps_second_mesh=0, fail_rank=1, fail_step=1
    )
    t0 = time.monotonic()
    with pytest.raises(DemoFailure) as info:
        run_ranks(cfg, timeout=DEMO_TIMEOUT)
    elapsed = time.monotonic() - t0
    msg = str(info.value)
    assert msg.startswith("rank 1 failed:"), msg
    assert "RuntimeError: rank 1 (mesh-1): injected failure inside the compiled step" in msg, msg
    # prompt: well inside the timeout (spawn + imports + one compile)
    assert elapsed < DEMO_TIMEOUT / 2, f"took {elapsed:.0f}s"
    _no_children_left()


@NEEDS_DEVICE_MESH_OPAQUE
def test_two_rank_gloo_demo_device_mesh():
    # the ShardTensor holds a DeviceMesh itself (an opaque on torch >= 2.12,
    # and on 2.10 / 2.11 once install() ran), no handle; its dispatch reads the mesh
    # (ndim, size()) while tracing
    cfg = DemoConfig(mode=MODE, backend="inductor", steps=2, steps_second_mesh=2, mesh="device_mesh")
    results = run_ranks(cfg, timeout=DEMO_TIMEOUT)
    assert {r["mesh_type"] for r in results} == {"DeviceMesh"}
    _check_results(cfg, results)


@pytest.mark.skipif(MODE != "backport", reason="torch 2.10/2.11: DeviceMesh is an opaque only with install()")
def test_device_mesh_refused_without_install():
    # mode "native" on 2.10/2.11 installs nothing: refused before any rank starts
    cfg = DemoConfig(mode="native", mesh="device_mesh")
    with pytest.raises(DemoFailure, match="DeviceMesh is not an opaque type here.*install\\(\\).*--mesh handle"):
        run_ranks(cfg, timeout=DEMO_TIMEOUT)
    _no_children_left()


@NEEDS_DEVICE_MESH_OPAQUE
def test_device_mesh_shard_reads_mesh_at_trace_time():
    # world-size-1 default group; a mesh that is not 1-D is refused by the
    # dispatch while tracing (it reads mesh.ndim / mesh.size() off the
    # FakeScriptObject), naming the mesh
    harness.setup_mode()
    DeviceMesh = device_mesh_type()
    assert DeviceMesh is not None, "DeviceMesh must be an opaque in this mode"
    fixtures.gloo_world()
    from torch.distributed.device_mesh import init_device_mesh

    torch._dynamo.reset()
    f = torch.compile(lambda x: x * 2, backend="aot_eager", fullgraph=True)
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    out = f(ShardTensor(torch.ones(2, 3), mesh, ("shard", 0), 1))
    assert out.mesh is mesh
    mesh2d = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    with pytest.raises(Exception, match=r"a 1-D mesh of 1 ranks expected, got a 2-D mesh \('dp', 'tp'\)"):
        f(ShardTensor(torch.ones(2, 3), mesh2d, ("shard", 0), 1))
    torch._dynamo.reset()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_two_rank_gloo_demo_cuda():
    cfg = DemoConfig(mode=MODE, backend="inductor", steps=2, steps_second_mesh=2, device="cuda")
    _check_results(cfg, run_ranks(cfg, timeout=DEMO_TIMEOUT))


# --------------------------------------------------------------------------
# before / after, in this process: world-size-1 gloo groups


class ShardTensorMeshInContext(ShardTensor):
    """The "before" picture: the same tensor, but the handle is flatten
    context (static metadata that Dynamo guards on by equality), not an
    inner attr, so every new mesh is a new graph."""

    def __tensor_flatten__(self):
        return ["_local"], (self.placement, self.world_size, self.mesh)

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        placement, world_size, mesh = ctx
        return ShardTensorMeshInContext(
            inner["_local"], mesh, placement, world_size, outer_size, outer_stride
        )


def _gloo_mesh(name: str) -> MeshHandle:
    return MeshHandle(dist.ProcessGroupGloo(dist.HashStore(), 0, 1), name)


def _compiles_for_two_meshes(cls) -> int:
    harness.setup_mode()  # another module may have changed the install state
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _MLP()
    counter = CompileCounterWithBackend("aot_eager")
    step = torch.compile(lambda x, t: _step(model, x, t), backend=counter, fullgraph=True)
    for name in ("mesh-a", "mesh-b"):
        mesh = _gloo_mesh(name)
        xs, ts = torch.randn(4, 8), torch.randn(4, 4)
        x = cls(local_chunk(xs, mesh, 0, 1), mesh, ("shard", 0), 1).requires_grad_(True)
        t = cls(local_chunk(ts, mesh, 0, 1), mesh, ("shard", 0), 1)
        before = collective_calls(mesh)
        loss, y = step(x, t)
        loss.backward()
        assert type(y) is cls and y.mesh is mesh
        assert type(x.grad) is cls and x.grad.mesh is mesh
        assert collective_calls(mesh) > before  # the graph's collectives ran on this mesh
        expected = ((model(xs) - ts) ** 2).mean()
        torch.testing.assert_close(loss, expected)
        model.zero_grad()
    torch._dynamo.reset()
    return counter.frame_count


def test_mesh_in_context_recompiles_per_mesh_opaque_attr_compiles_once():
    assert _compiles_for_two_meshes(ShardTensorMeshInContext) == 2
    assert _compiles_for_two_meshes(ShardTensor) == 1


class OtherMeshHandle(MeshHandle):
    """Another mesh type (as a DeviceMesh is to a MeshHandle)."""


tsrt.register_opaque(OtherMeshHandle, typ="reference")


def test_cache_key_names_the_mesh_type_not_the_mesh():
    # AOTAutogradCache keys a subclass input by _stable_hash_for_caching:
    # a new mesh of the same type must hit (one graph serves every mesh),
    # another mesh type must not (its collectives are other ops)
    local = torch.randn(4, 8)

    def key(mesh):
        return ShardTensor(local, mesh, ("shard", 0), 1)._stable_hash_for_caching()

    a, b = _gloo_mesh("a"), _gloo_mesh("b")
    other = OtherMeshHandle(a.group, "other")
    assert key(a) == key(b)
    assert key(a) != key(other)
    assert "OtherMeshHandle" in key(other)
