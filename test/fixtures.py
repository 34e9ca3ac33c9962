"""What several test modules share: process groups and meshes, the 2-rank
spawner, the stock-vs-installed comparator, and the known torch bugs more
than one module records.

:mod:`harness` is the machinery (the mode under test, expected failures,
graph dumps); this module holds the objects tests are written with. It may
be imported before the mode is set (a spawned rank imports it to start):
nothing here registers an opaque or patches anything at import.
"""

from __future__ import annotations

import importlib
import os
import queue as queue_mod
import socket
import sys
import time
import traceback

import harness
import pytest

import torch
import torch.distributed as dist

from torch_subclass_rt._modes import Mode

# --------------------------------------------------------------------------
# one process: a world-size-1 gloo default group (DeviceMesh needs one)


def gloo_world() -> None:
    """The default process group: gloo, rank 0 of 1, in this process."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def mesh(*names: str):
    """A CPU DeviceMesh of one rank per dimension, named ``names``."""
    from torch.distributed.device_mesh import init_device_mesh

    gloo_world()
    return init_device_mesh("cpu", (1,) * len(names), mesh_dim_names=names)


def new_group():
    """A new gloo ProcessGroup over rank 0 of the one-rank world."""
    gloo_world()
    return dist.new_group([0], backend="gloo")


# --------------------------------------------------------------------------
# known torch bugs that more than one module records

#: torch 2.12 registers ProcessGroup as an opaque, but its
#: ``isinstance(x, OpaqueBase)`` is nominal, so AOTAutograd's metadata check
#: refuses a ProcessGroup among inner attrs; 2.13 asks the registry, and
#: install() carries that to 2.12 (points/fixes.py). Recorded in one process
#: (test_device_mesh_opaque.py) and over two ranks
#: (test_distributed_opaque_ranks.py).
PROCESS_GROUP_BUG_FIX = "PR 180530"
PROCESS_GROUP_BUG_RELEASES = ("2.12.0", "2.12.1")
PROCESS_GROUP_BUG_MESSAGE = r"expected Tensor or OpaqueBase, got <class '[\w.]*ProcessGroup'>"


def process_group_bug():
    """:func:`harness.upstream_bug` for a test that puts a ProcessGroup
    among a subclass's inner attrs."""
    return harness.upstream_bug(
        PROCESS_GROUP_BUG_FIX, broken_on=PROCESS_GROUP_BUG_RELEASES, fails_with=(AssertionError,),
        match=PROCESS_GROUP_BUG_MESSAGE,
    )


def process_group_bug_expected() -> bool:
    """Whether this torch and mode have that bug (nothing carries the fix)."""
    return (
        harness._torch_compat.torch_version() in PROCESS_GROUP_BUG_RELEASES
        and harness.current_mode() == Mode.NATIVE
    )


# --------------------------------------------------------------------------
# stock torch and install() in one process


def stock_and_installed(observe):
    """``(observe() on stock torch, observe() with install())``: install()
    is taken out for the first call and put back in the mode under test
    (:func:`harness.restore_mode`) whatever happens. Dynamo's caches are
    reset before each call, so neither reads the other's compiles."""
    import torch_subclass_rt as tsrt

    def run():
        torch._dynamo.reset()
        return observe()

    tsrt.uninstall()
    assert tsrt.status().mode == Mode.OFF, tsrt.status()
    try:
        stock = run()
        st = tsrt.install(force=harness.current_mode() == Mode.FORCED)
        assert st.mode == harness.current_mode(), st
        installed = run()
    finally:
        harness.restore_mode()
    return stock, installed


# --------------------------------------------------------------------------
# spawned gloo ranks


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_entry(rank: int, world: int, port: int, target: tuple[str, str], args: tuple,
                results, cache_per_rank: bool) -> None:
    """A spawned rank: the mode, the test module, the process group, then
    ``target(rank, *args)``; its result or traceback goes to the parent."""
    ok = False
    try:
        if cache_per_rank:
            # (why: test_dtensor_scenarios._spawn)
            base = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
            if base:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{base}-rank{rank}"
        # no conftest in a rank: the mode first, then the test module,
        # whose code may need it (Note [The mode is set before a test
        # module runs])
        harness.setup_mode()
        module, name = target
        fn = getattr(importlib.import_module(module), name)
        torch.set_num_threads(1)
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = 1
        dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
        results.put(("ok", rank, fn(rank, *args)))
        ok = True
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - everything goes to the parent
        results.put(("error", rank, traceback.format_exc()))
    finally:
        results.close()
        results.join_thread()
        if not ok:
            sys.stderr.flush()
            os._exit(1)


def run_ranks(fn, *args, world: int = 2, timeout: float, cache_per_rank: bool = False) -> list:
    """``fn(rank, *args)`` in ``world`` spawned processes joined in one gloo
    group; the ranks' results, by rank. ``fn`` is a module-level function of
    a test module (a rank imports it by name). A rank that raises, dies
    without reporting, or a run past ``timeout`` seconds fails the test
    (``pytest.fail``) with the rank's traceback; no rank is left running.
    ``cache_per_rank``: each rank its own Inductor cache directory."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    target = (fn.__module__, fn.__qualname__)
    procs = [
        ctx.Process(
            target=_rank_entry, args=(r, world, port, target, args, results, cache_per_rank), daemon=True
        )
        for r in range(world)
    ]
    done: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.start()
        while len(done) < world:
            try:
                status, rank, payload = results.get(timeout=0.5)
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if r not in done and p.exitcode is not None]
                if dead:
                    try:  # a report may still be in the pipe
                        status, rank, payload = results.get(timeout=2.0)
                    except queue_mod.Empty:
                        pytest.fail(f"rank {dead[0]} exited without reporting")
                elif time.monotonic() > deadline:
                    pytest.fail(f"timed out after {timeout:.0f}s")
                else:
                    continue
            if status == "error":
                pytest.fail(f"rank {rank} failed:\n{payload}")
            done[rank] = payload
        return [done[r] for r in range(world)]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        results.close()

