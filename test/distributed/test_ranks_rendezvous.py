"""Spawned ranks meet through a file store of their own, not a TCP port.

The demo's and the tests' spawners used to pick a free port, close it and
hand it to the ranks; another run on the machine (two matrix sessions run
side by side) could bind it before rank 0 did, and the ranks then waited
for a peer that never came. A file in a fresh temporary directory cannot be
taken (torch_subclass_rt.demo.rendezvous_file).
"""

from __future__ import annotations

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

