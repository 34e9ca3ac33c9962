"""Counting a child process's instructions in regions it marks, under callgrind.

The machinery every instruction-count benchmark here shares
(``instructions.py``, ``attr_vs_context.py``): :func:`run` starts a
benchmark script's ``--child`` under ``valgrind --tool=callgrind
--instr-atstart=no --collect-atstart=no`` and serves its requests;
:class:`Child` is the child's side. Imports, install() and warm-up run
uninstrumented (about 5x slower than native instead of 50x).

The protocol: before a region the child asks (a line on a pipe) for
instrumentation on; the parent runs ``callgrind_control -i on PID`` and
``-z`` and answers by creating a file, for which the child spins (so the
valgrind core keeps polling and the switch never lands inside a region).
Each region is bracketed by torch's own client requests
(``torch._C._valgrind_toggle`` / ``_valgrind_toggle_and_dump_stats``): one
dump per region, whose ``totals:`` line the parent reads back. The child
ends by writing ``child.json`` (its region labels and whatever else it
reports) into the shared directory. Imports no torch at module level.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("valgrind", "callgrind_control")


def available() -> bool:
    return all(shutil.which(tool) for tool in TOOLS)


def add_child_arguments(parser: argparse.ArgumentParser) -> None:
    """The hidden arguments :func:`run` starts a script's child with."""
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--request-fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ack-dir", help=argparse.SUPPRESS)


class Child:
    """The measuring side, run under callgrind."""

    def __init__(self, request_fd: int, ack_dir: str) -> None:
        self.request = os.fdopen(request_fd, "w", buffering=1)
        self.ack_dir = ack_dir
        self.seq = 0
        self.instrumented = False
        self.labels: list[str] = []

    def instrument(self, on: bool) -> None:
        if on == self.instrumented:
            return
        self.seq += 1
        ack = os.path.join(self.ack_dir, f"ack-{self.seq}")
        self.request.write(f"{'on' if on else 'off'} {self.seq}\n")
        while not os.path.exists(ack):
            time.sleep(0)
        self.instrumented = on

    def region(self, label: str, fn, *args) -> None:
        """Count the instructions of ``fn(*args)`` into a dump of its own."""
        import torch

        assert self.instrumented
        # a collection inside the region lands on whichever call crosses
        # the threshold: left out, so K calls cost K times one call
        gc.collect()
        gc.disable()
        torch._C._valgrind_toggle()
        fn(*args)
        torch._C._valgrind_toggle_and_dump_stats()
        gc.enable()
        self.labels.append(label)

    def finish(self, info: dict) -> None:
        """Hand the parent the labels of the dumps, in order, and ``info``."""
        Path(self.ack_dir, "child.json").write_text(json.dumps({**info, "labels": self.labels}))


def total_ir(path: Path) -> int:
    """The instruction count of one callgrind dump (its totals line)."""
    for line in path.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals line in callgrind dump {path}")


# Note [Counting with glibc's fastbins off]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# In some memory layouts (about one in three processes; which one follows
# from the environment's size, Note [The gate samples memory layouts] in
# instructions.py) a chunk freed during each call lies next to the heap's
# top, and glibc's free() then consolidates every fastbin chunk
# (malloc_consolidate, unlink_chunk): about 23 k instructions more per call
# of 2.10's forward at N = 10, which is 2.1 k more "per subclass input"
# (30.25 k against 28.15 k), in glibc, with the same Python and torch code
# run. Callgrind's per-function diff of two such processes has nothing else
# above 2 k. With fastbins off (``glibc.malloc.mxfast=0``) there is nothing
# to consolidate: the same processes count 28.16 k - 28.43 k in every layout
# tried, and both the subclass and the plain call about 1.5 % more (the
# extra per input does not move). So the children count with fastbins off:
# a figure then answers for our code and torch's, not for where glibc's
# top chunk happens to be. A user's process pays the consolidation or not
# by the same lottery; docs/performance.md says so.
#: glibc tunables of every measuring child
MALLOC_TUNABLES = "glibc.malloc.mxfast=0"


def child_environment(env: dict | None = None) -> dict:
    """The measuring child's environment: ours, then ``env``, with a fixed
    hash seed, this repository on ``PYTHONPATH`` and
    Note [Counting with glibc's fastbins off]."""
    child = {**os.environ, **(env or {})}
    tunables = [t for t in child.get("GLIBC_TUNABLES", "").split(":")
                if t and not t.startswith("glibc.malloc.mxfast=")]
    return {
        **child,
        "PYTHONHASHSEED": "0",
        "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
        "GLIBC_TUNABLES": ":".join([*tunables, MALLOC_TUNABLES]),
    }


def run(script: str, argv: list[str], env: dict | None = None, verbose: bool = False,
        keep: str | None = None) -> tuple[dict, dict[str, int]]:
    """Run ``script --child *argv`` under callgrind; (the child's info, the
    instructions of each region by label)."""
    for tool in TOOLS:
        if shutil.which(tool) is None:
            raise SystemExit(f"{Path(script).name}: {tool} is not on PATH: install valgrind "
                             "(e.g. apt-get install valgrind) to count instructions")
    with tempfile.TemporaryDirectory(prefix="tsrt-callgrind-") as tmp:
        out = os.path.join(tmp, "callgrind.out")
        read_fd, write_fd = os.pipe()
        cmd = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
            f"--callgrind-out-file={out}", "--vgdb=yes",
            sys.executable, str(Path(script).resolve()), "--child",
            "--request-fd", str(write_fd), "--ack-dir", tmp, *argv,
        ]
        child_env = child_environment(env)
        log = open(os.path.join(tmp, "valgrind.log"), "w+")
        proc = subprocess.Popen(cmd, pass_fds=(write_fd,), env=child_env,
                                stdout=log, stderr=subprocess.STDOUT)
        os.close(write_fd)
        with os.fdopen(read_fd) as requests:
            for line in requests:
                state, seq = line.split()
                # zeroed after each switch: callgrind 3.19 otherwise can
                # total a later region's dump below zero (wrapped to 2**64)
                for ctl_args in (["-i", state], ["-z"]):
                    ctl = subprocess.run(["callgrind_control", *ctl_args, str(proc.pid)],
                                         capture_output=True, text=True)
                    if ctl.returncode != 0 or "OK" not in ctl.stdout:
                        proc.kill()
                        raise RuntimeError(f"callgrind_control {' '.join(ctl_args)} {proc.pid} "
                                           f"failed: {ctl.stdout}{ctl.stderr}")
                Path(tmp, f"ack-{seq}").touch()
                if verbose:
                    print(f"  instrumentation {state} ({seq})", file=sys.stderr, flush=True)
        rc = proc.wait()
        log.seek(0)
        if rc != 0:
            raise RuntimeError(f"the measuring child failed (exit {rc}):\n{log.read()[-6000:]}")
        info = json.loads(Path(tmp, "child.json").read_text())
        dumps = sorted(Path(tmp).glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        if len(dumps) != len(info["labels"]):
            raise RuntimeError(f"{len(dumps)} callgrind dumps for {len(info['labels'])} regions")
        ir = {label: total_ir(p) for label, p in zip(info["labels"], dumps)}
        if keep:
            shutil.copytree(tmp, keep, dirs_exist_ok=True)
    return info, ir
