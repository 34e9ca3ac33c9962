"""The spawner of ranks (torch_subclass_rt.ranks), which the demo and the
tests share.

- Ranks meet through a file store of their own, not a TCP port. The
  spawners used to pick a free port, close it and hand it to the ranks;
  another run on the machine (two matrix sessions run side by side) could
  bind it before rank 0 did, and the ranks then waited for a peer that
  never came.
- No rank leaves before every rank is done. A rank whose function runs no
  collective finished, tore its gloo pairs down and exited while its peer
  was still connecting, which failed the peer's init_process_group
  ("Connection closed by peer") in a CI run.
"""

from __future__ import annotations

import os
import time

import fixtures
import torch.distributed as dist


def _store_kind(rank: int) -> str:
    store = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):  # PrefixStore around the real one
        store = store.underlying_store
    return type(store).__name__


def test_ranks_meet_through_a_file_store():
    # a TCPStore (the port the spawner picked) fails this
    kinds = fixtures.run_ranks(_store_kind, timeout=120)
    assert kinds == ["FileStore", "FileStore"], kinds


def _process_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("State:"):
                    return line.split()[1]  # Z: exited, not yet reaped
    except FileNotFoundError:
        pass
    return "gone"


def _peer_state_after_a_while(rank: int) -> str:
    store = dist.distributed_c10d._get_default_store()
    store.set(f"pid{rank}", str(os.getpid()))
    if rank != 0:
        return "done"  # no collective: nothing holds this rank back but the spawner
    peer = int(store.get("pid1"))
    time.sleep(3)
    return _process_state(peer)


def test_no_rank_leaves_before_every_rank_is_done():
    # without the spawner's closing barrier rank 1 has exited ("Z" or
    # "gone") by the time rank 0 looks
    states = fixtures.run_ranks(_peer_state_after_a_while, timeout=120)
    assert states[1] == "done"
    assert states[0] not in ("Z", "gone", "X"), states
