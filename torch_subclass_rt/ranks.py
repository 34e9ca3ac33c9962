"""Spawned gloo ranks: the one spawner the demo and the tests share.

:func:`run` starts ``world`` processes, joins them in one gloo group that
meets through a file of its own (:func:`rendezvous_file`), calls a
module-level function in each and returns the ranks' results by rank. A
rank that raises, dies without reporting, or a run past its timeout raises
:class:`RankFailure` with the rank's traceback; no rank is left running.
"""

from __future__ import annotations

import importlib
import os
import queue as queue_mod
import sys
import tempfile
import time
import traceback
from typing import Any, Callable


class RankFailure(RuntimeError):
    """A rank failed, timed out or died; the message carries its error."""


def rendezvous_file(directory: str) -> str:
    """Where spawned ranks meet: a file store in ``directory`` (a fresh
    temporary one). A TCP port found free and closed before rank 0 binds it
    can be taken in between by another run on the machine (two matrix
    sessions side by side); a file of our own cannot."""
    return "file://" + os.path.join(directory, "rendezvous")


def _ref(fn: Callable) -> tuple[str, str]:
    # by name, not pickled: unpickling a function imports its module, and a
    # test module must be imported only after its rank has set the mode
    # (Note [The mode is set before a test module runs], test/conftest.py)
    return fn.__module__, fn.__qualname__


def _resolve(ref: tuple[str, str]) -> Callable:
    module, name = ref
    return getattr(importlib.import_module(module), name)


def _rank_entry(rank: int, world: int, rendezvous: str, setup: tuple[str, str] | None,
                target: tuple[str, str], args: tuple, env: dict[str, str], results) -> None:
    """One spawned rank. Reports ("ok", rank, result) or ("error", rank,
    traceback) on ``results``; on error it exits at once without tearing
    down the process group (a peer may be stuck in a collective with it)."""
    ok = False
    try:
        os.environ.update(env)
        import torch

        torch.set_num_threads(1)
        import torch._inductor.config as inductor_config
        import torch.distributed as dist

        inductor_config.compile_threads = 1
        if setup is not None:
            _resolve(setup)()
        fn = _resolve(target)
        dist.init_process_group("gloo", rank=rank, world_size=world, init_method=rendezvous)
        result = fn(rank, *args)
        # No rank leaves before every rank is done: gloo connects its pairs
        # one side at a time, and a rank whose function ran no collective
        # could finish and close its side while a peer is still inside
        # init_process_group ("Connection closed by peer").
        dist.barrier()
        results.put(("ok", rank, result))
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


def run(fn: Callable, *args: Any, world: int = 2, timeout: float, env: dict[str, str] | None = None,
        setup: Callable[[], object] | None = None, name: str = "tsrt-rank") -> list:
    """``fn(rank, *args)`` in ``world`` spawned processes joined in one gloo
    group; the ranks' results, by rank.

    ``fn`` (and ``setup``) are module-level functions, found in a rank by
    their module and name. In each rank: ``env`` is set, torch gets one
    thread and Inductor one compile worker, ``setup()`` runs, then ``fn``'s
    module is imported and the group formed. Raises :class:`RankFailure` as
    soon as one rank fails or dies, or the run passes ``timeout`` seconds;
    every child is terminated (then killed) and reaped either way.
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    meeting = tempfile.TemporaryDirectory(prefix="tsrt-ranks-")
    setup_ref = None if setup is None else _ref(setup)
    procs = [
        ctx.Process(
            target=_rank_entry,
            args=(r, world, rendezvous_file(meeting.name), setup_ref, _ref(fn), args, dict(env or {}),
                  results),
            name=f"{name}{r}", daemon=True,
        )
        for r in range(world)
    ]
    done: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.start()
        while len(done) < world:
            try:
                status, rank, payload = results.get(timeout=0.2)
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if r not in done and p.exitcode is not None]
                if dead:
                    try:  # died without reporting, or its report is still in the pipe
                        status, rank, payload = results.get(timeout=2.0)
                    except queue_mod.Empty:
                        code = procs[dead[0]].exitcode
                        raise RankFailure(
                            f"rank {dead[0]} exited with code {code} without reporting"
                        ) from None
                elif time.monotonic() > deadline:
                    left = [r for r in range(world) if r not in done]
                    raise RankFailure(f"timed out after {timeout:.0f}s; ranks still running: {left}")
                else:
                    continue
            if status == "error":
                raise RankFailure(f"rank {rank} failed:\n{payload}")
            done[rank] = payload
        for p in procs:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
        return [done[r] for r in range(world)]
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        results.close()
        meeting.cleanup()
