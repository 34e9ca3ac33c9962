"""``python -m torch_subclass_rt demo``: a sharded MLP over real process groups.

Spawns ``world_size`` ranks (gloo on CPU, or CUDA tensors over gloo), each
of which installs torch_subclass_rt, trains a small MLP on a batch-sharded
``ShardTensor`` (see :mod:`torch_subclass_rt.examples.sharded`) with a
compiled step, and checks every step against the same step in eager mode and
against a single-process reference on the whole batch (loss, output, input
and parameter grads). Then it builds a second, fresh process group and
mesh and trains on, checking that nothing recompiles, that outputs and
grads carry the new mesh, and that the collectives ran on the new group.
The mesh is our ``MeshHandle`` (``--mesh handle``, any torch) or, on
a ``DeviceMesh`` itself (``--mesh device_mesh``: torch >= 2.12 registers it as
an opaque, torch 2.11 once ``install()`` ran).

A rank that raises makes the run fail promptly with that rank's traceback:
the parent watches a result queue and the children's exit codes, terminates
the other ranks (which would otherwise wait in a collective) and always
reaps every child.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import time
from typing import Any

import torch

from . import ranks
from ._modes import Mode

#: "auto" (whatever install() picks on this torch) and the install modes
MODES = ("auto", Mode.BACKPORT, Mode.FORCED, Mode.NATIVE, Mode.NATIVE_FIXES)


class DemoFailure(RuntimeError):
    """A rank failed, timed out or died; the message carries its error."""


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    #: "auto": install() (backport on 2.11, native+fixes on 2.12.1-2.14.1,
    #: native on other >= 2.12); "backport", "native+fixes" (install()),
    #: "forced" (install(force=True)), "native" (install() is never called)
    mode: str = "auto"
    backend: str = "inductor"
    world_size: int = 2
    steps: int = 3  # on the first mesh
    steps_second_mesh: int = 2
    device: str = "cpu"
    #: what the ShardTensor holds as its mesh: "handle" (our MeshHandle
    #: around a process group; every torch) or "device_mesh" (a 1-D
    #: DeviceMesh itself, which torch >= 2.12 registers as an opaque, and
    #: torch 2.11 once install() ran)
    mesh: str = "handle"
    #: inject an error into this rank's compiled step (None: no failure)
    fail_rank: int | None = None
    fail_step: int = 0
    atol: float = 1e-5
    rtol: float = 1e-4


# --------------------------------------------------------------------------
# one rank


def _apply_mode(mode: str):
    import torch_subclass_rt as tsrt

    if mode == Mode.NATIVE:
        return tsrt.status()
    st = tsrt.install(force=(mode == Mode.FORCED))
    if mode != "auto" and st.mode != mode:
        raise RuntimeError(f"mode {mode!r} requested but install() gave {st!r}")
    return st


class _MLP(torch.nn.Module):
    def __init__(self, d_in: int = 8, d_hidden: int = 32, d_out: int = 4) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, d_hidden)
        self.fc2 = torch.nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _step(model, x, target):
    y = model(x)
    loss = ((y - target) ** 2).mean()
    # y is returned for checking only; detached, so backward() on the loss
    # alone is the whole backward (AOTAutograd guesses a tangent otherwise)
    return loss, y.detach()


@dataclasses.dataclass
class _Run:
    """One rank's training run: its models, data, compiled step and what it
    measured so far."""

    rank: int
    cfg: DemoConfig
    dev: torch.device
    #: "ref" (single process, whole batch), "eager" and "compiled" (sharded)
    models: dict[str, torch.nn.Module]
    #: per step: the global batch and its targets
    xs: torch.Tensor
    ts: torch.Tensor
    counter: Any
    compiled: Any
    times: dict[str, list[float]] = dataclasses.field(
        default_factory=lambda: {"eager": [], "compiled": []}
    )
    max_err: float = 0.0


def _setup(rank: int, cfg: DemoConfig) -> _Run:
    """Three identical models, the data of every step, the compiled step."""
    from torch._dynamo.testing import CompileCounterWithBackend

    dev = torch.device(cfg.device if cfg.device != "cuda" else "cuda:0")
    torch.manual_seed(0)
    base = _MLP().to(dev)
    models = {k: copy.deepcopy(base) for k in ("ref", "eager", "compiled")}
    n_steps = cfg.steps + cfg.steps_second_mesh
    global_batch = 8 * cfg.world_size
    xs = torch.randn(n_steps, global_batch, 8, device=dev)
    ts = torch.randn(n_steps, global_batch, 4, device=dev)
    counter = CompileCounterWithBackend(cfg.backend)
    compiled = torch.compile(
        lambda x, t: _step(models["compiled"], x, t), backend=counter, fullgraph=True
    )
    return _Run(rank, cfg, dev, models, xs, ts, counter, compiled)


def _close(run: _Run, actual, expected, what: str) -> None:
    """Assert ``actual`` matches ``expected``; track the largest error."""
    actual, expected = actual.detach(), expected.detach()
    if actual.shape != expected.shape:
        raise AssertionError(
            f"rank {run.rank}: {what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        )
    run.max_err = max(run.max_err, (actual - expected).abs().max().item())
    torch.testing.assert_close(
        actual, expected, atol=run.cfg.atol, rtol=run.cfg.rtol,
        msg=lambda m: f"rank {run.rank}: {what}: {m}",
    )


def _sync(run: _Run) -> None:
    if run.dev.type == "cuda":
        torch.cuda.synchronize()


def _reference_step(run: _Run, i: int):
    """Step ``i`` of the single-process reference, on the whole batch:
    (input, loss, output)."""
    xr = run.xs[i].clone().requires_grad_(True)
    loss_r, y_r = _step(run.models["ref"], xr, run.ts[i])
    loss_r.backward()
    return xr, loss_r, y_r


def _sharded_steps(run: _Run, mesh: Any, i: int) -> dict[str, tuple[Any, Any, Any]]:
    """Step ``i`` eager and compiled on this rank's shard, each timed:
    kind -> (loss, output, input)."""
    from .examples.sharded import distribute, inject_failure

    cfg = run.cfg
    outs = {}
    for kind in ("eager", "compiled"):
        x = distribute(run.xs[i], mesh, 0).detach().requires_grad_(True)
        t = distribute(run.ts[i], mesh, 0)
        if kind == "compiled" and cfg.fail_rank == run.rank and i == cfg.fail_step:
            inject_failure(mesh, "injected failure inside the compiled step")
        _sync(run)
        t0 = time.perf_counter()
        loss, y = run.compiled(x, t) if kind == "compiled" else _step(run.models[kind], x, t)
        loss.backward()
        _sync(run)
        run.times[kind].append(time.perf_counter() - t0)
        outs[kind] = (loss, y, x)
    return outs


def _check_against_reference(run: _Run, mesh: Any, i: int, outs, reference) -> None:
    """Each sharded step against the reference: output and input grad carry
    ``mesh``; loss, output and every grad match."""
    from .examples.sharded import ShardTensor

    rank, world = run.rank, run.cfg.world_size
    xr, loss_r, y_r = reference
    for kind, (loss, y, x) in outs.items():
        tag = f"step {i} {kind} vs single-process"
        if type(y) is not ShardTensor or y.mesh is not mesh:
            raise AssertionError(f"rank {rank}: {tag}: output carries {getattr(y, 'mesh', None)!r}, not {mesh!r}")
        if type(x.grad) is not ShardTensor or x.grad.mesh is not mesh:
            raise AssertionError(
                f"rank {rank}: {tag}: input grad carries {getattr(x.grad, 'mesh', None)!r}, not {mesh!r}"
            )
        _close(run, loss, loss_r, f"{tag}: loss")
        _close(run, y.full_tensor(), y_r, f"{tag}: output")
        _close(run, x.grad._local, xr.grad.chunk(world, 0)[rank], f"{tag}: input grad")
        for (name, p), p_ref in zip(run.models[kind].named_parameters(), run.models["ref"].parameters()):
            if type(p.grad) is not torch.Tensor:
                raise AssertionError(f"rank {rank}: {tag}: {name}.grad is a {type(p.grad).__name__}")
            _close(run, p.grad, p_ref.grad, f"{tag}: {name}.grad")


def _check_compiled_vs_eager(run: _Run, i: int, outs) -> None:
    _close(run, outs["compiled"][0], outs["eager"][0], f"step {i} compiled vs eager: loss")
    for (name, pc), pe in zip(run.models["compiled"].named_parameters(), run.models["eager"].parameters()):
        _close(run, pc.grad, pe.grad, f"step {i} compiled vs eager: {name}.grad")


def _sgd_update(models: dict[str, torch.nn.Module]) -> None:
    with torch.no_grad():
        for m in models.values():
            for p in m.parameters():
                p -= 0.1 * p.grad
                p.grad = None


def _train_step(run: _Run, mesh: Any, i: int) -> None:
    """Step ``i`` on ``mesh``: reference, eager and compiled, all checked,
    then the same update for every model."""
    reference = _reference_step(run, i)
    outs = _sharded_steps(run, mesh, i)
    _check_against_reference(run, mesh, i, outs, reference)
    _check_compiled_vs_eager(run, i, outs)
    _sgd_update(run.models)


def _check_mesh_switch(run: _Run, mesh1: Any, calls1: int, compiles_first: int) -> None:
    """After the steps on mesh-2: none of them ran a collective on mesh-1,
    and the function compiled once for both meshes."""
    from .examples.sharded import collective_calls

    if collective_calls(mesh1) != calls1:
        raise AssertionError(
            f"rank {run.rank}: steps on mesh-2 ran {collective_calls(mesh1) - calls1} "
            "collective(s) on mesh-1"
        )
    if run.counter.frame_count != 1:
        raise AssertionError(
            f"rank {run.rank}: {run.counter.frame_count} compiles for two meshes "
            f"({compiles_first} after mesh-1), expected 1"
        )


def _per_step_ms(cfg: DemoConfig, ts_: list[float]) -> float:
    """Mean ms of the steps after each mesh's first (which includes compilation)."""
    warm = ts_[1 : cfg.steps] + ts_[cfg.steps + 1 :]
    return 1000 * sum(warm) / len(warm) if warm else float("nan")


def _result(run: _Run, mesh1: Any, mesh2: Any) -> dict[str, Any]:
    from .examples.sharded import collective_calls

    cfg = run.cfg
    return {
        "rank": run.rank,
        "status": _short_status(cfg.mode),
        "compiles": run.counter.frame_count,
        "max_err": run.max_err,
        "eager_ms": _per_step_ms(cfg, run.times["eager"]),
        "compiled_ms": _per_step_ms(cfg, run.times["compiled"]),
        "first_compiled_s": run.times["compiled"][0],
        "mesh2_calls": collective_calls(mesh2),
        "mesh_type": type(mesh1).__name__,
        "caches": _cache_counters(),
    }


def _train(rank: int, cfg: DemoConfig) -> dict[str, Any]:
    """This rank's whole run: ``cfg.steps`` on a mesh, then
    ``cfg.steps_second_mesh`` on a fresh one; raises on any mismatch."""
    from .examples.sharded import collective_calls

    run = _setup(rank, cfg)
    mesh1 = _new_mesh(cfg, "mesh-1")
    for i in range(cfg.steps):
        _train_step(run, mesh1, i)
    compiles_first = run.counter.frame_count

    # a fresh process group and mesh: same graph, new runtime object
    mesh2 = _new_mesh(cfg, "mesh-2")
    calls1 = collective_calls(mesh1)
    for i in range(cfg.steps, cfg.steps + cfg.steps_second_mesh):
        _train_step(run, mesh2, i)
    _check_mesh_switch(run, mesh1, calls1, compiles_first)
    return _result(run, mesh1, mesh2)


MESH_KINDS = ("handle", "device_mesh")


def _new_mesh(cfg: DemoConfig, name: str) -> Any:
    """A mesh over a freshly created gloo group of all ranks."""
    import torch.distributed as dist

    from .examples.sharded import MeshHandle, device_mesh_type

    group = dist.new_group(list(range(cfg.world_size)), backend="gloo")
    if cfg.mesh == "handle":
        return MeshHandle(group, name)
    DeviceMesh = device_mesh_type()
    if DeviceMesh is None:
        raise RuntimeError(_device_mesh_refusal())
    return DeviceMesh.from_group(group, cfg.device)


def _installs_device_mesh(mode: str) -> bool:
    """Whether a rank in this mode registers DeviceMesh via install()
    (torch 2.10 and 2.11: points/distributed_opaques.py)."""
    from . import _torch_compat

    return mode in ("auto", Mode.BACKPORT) and _torch_compat.torch_version() in _torch_compat.BACKPORT_VERSIONS


def _device_mesh_refusal() -> str:
    return (
        f"--mesh device_mesh: DeviceMesh is not an opaque type here (torch "
        f"{torch.__version__}, mode without install()); torch >= 2.12 registers it, "
        "torch 2.10 and 2.11 once torch_subclass_rt.install() ran (--mode auto or "
        "backport). Or use --mesh handle, which wraps the process group in a MeshHandle"
    )


def _cache_counters() -> str:
    from torch._dynamo.utils import counters

    found = {
        k: v
        for group in ("aot_autograd", "inductor")
        for k, v in counters[group].items()
        if "cache" in k
    }
    return ", ".join(f"{k}={v}" for k, v in sorted(found.items())) or "none"


def _short_status(requested: str) -> str:
    import torch_subclass_rt as tsrt

    st = tsrt.status()
    if requested == Mode.NATIVE:
        return f"mode='native' (install() not called; status: mode={st.mode!r})"
    return f"mode={st.mode!r}, {len(st.points)} patch point(s)"


def _rank_main(rank: int, cfg: DemoConfig) -> dict[str, Any]:
    """One spawned rank (torch_subclass_rt.ranks.run): the mode, then the run."""
    _apply_mode(cfg.mode)
    return _train(rank, cfg)


# --------------------------------------------------------------------------
# the parent


def run_ranks(cfg: DemoConfig, timeout: float = 300.0) -> list[dict[str, Any]]:
    """Run the demo on ``cfg.world_size`` spawned ranks; the per-rank results.

    Raises :class:`DemoFailure` with the first failing rank's traceback as
    soon as one rank fails, dies or the whole run passes ``timeout``
    seconds; every child is terminated (then killed) and reaped either way.
    """
    if cfg.mode not in MODES:
        raise ValueError(f"mode {cfg.mode!r}: expected one of {', '.join(MODES)}")
    if cfg.mesh not in MESH_KINDS:
        raise ValueError(f"mesh {cfg.mesh!r}: expected one of {', '.join(MESH_KINDS)}")
    if cfg.mesh == "device_mesh":
        from .examples.sharded import device_mesh_type

        # the ranks install() first (mode "auto" / "backport" on 2.11)
        if device_mesh_type() is None and not _installs_device_mesh(cfg.mode):
            raise DemoFailure(_device_mesh_refusal())
    try:
        return ranks.run(_rank_main, cfg, world=cfg.world_size, timeout=timeout, name="tsrt-demo-rank")
    except ranks.RankFailure as e:
        raise DemoFailure(str(e)) from None


def format_report(cfg: DemoConfig, results: list[dict[str, Any]]) -> str:
    r0 = results[0]
    lines = [
        f"torch {torch.__version__}  {r0['status']}",
        f"backend={cfg.backend} device={cfg.device} world_size={cfg.world_size} "
        f"steps={cfg.steps} on mesh-1 + {cfg.steps_second_mesh} on a fresh mesh-2 "
        f"(mesh: {r0['mesh_type']})",
        f"compiles: {', '.join(str(r['compiles']) for r in results)} (per rank; expected 1)",
        f"max |error| vs eager and single-process: {max(r['max_err'] for r in results):.3g}",
        "time per step (fwd+bwd, after warm-up, rank 0): "
        f"eager {r0['eager_ms']:.2f} ms, compiled {r0['compiled_ms']:.2f} ms "
        f"(first compiled step incl. compile {r0['first_compiled_s']:.1f} s)",
        "mesh-2: outputs and grads carry the new mesh; its collectives ran on the new group",
        f"compile caches (rank 0): {r0['caches']}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m torch_subclass_rt demo")
    add_arguments(parser)
    return run_cli(parser.parse_args(argv))


def add_arguments(parser) -> None:
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (default inductor)")
    parser.add_argument("--mode", default="auto", choices=MODES, help="install mode in every rank")
    parser.add_argument("--steps", type=int, default=3, help="steps on the first mesh")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument(
        "--mesh", default="handle", choices=MESH_KINDS,
        help="the ShardTensor's mesh: our MeshHandle or a DeviceMesh (an opaque on torch >= 2.12, and on 2.11 with install())",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole run")


def run_cli(args) -> int:
    cfg = DemoConfig(
        mode=args.mode, backend=args.backend, steps=args.steps, device=args.device, mesh=args.mesh
    )
    t0 = time.perf_counter()
    try:
        results = run_ranks(cfg, timeout=args.timeout)
    except DemoFailure as e:
        print(f"demo FAILED: {e}", file=sys.stderr)
        return 1
    print(format_report(cfg, results))
    print(f"demo PASSED in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
