"""The first call at large N: heap bytes, and whose code the compile runs.

The compile of ``fwd+bwd`` (benchmarks/workload.py) over N subclass inputs
(distinct handles) and, for reference, over N plain tensors: the first call
(trace, compile, one run). For each, in passes of its own:

* ``peak`` / ``kept``: the Python heap during and after the first call,
  in bytes (``tracemalloc``; after a warm-up compile at N = 2 has paid
  the one-time imports);
* where the compile runs: a ``cProfile`` of the first call, its function
  calls and own time summed by the package of the function (our
  ``torch_subclass_rt``, and torch's ``_dynamo``, ``_functorch``,
  ``_subclasses``, ``fx``, ``_inductor``, ...). Function-call counts do
  not depend on the machine's load; own time does (quote it as a share).

* ``rss_peak`` / ``rss_kept``: the process's resident memory during and
  after the first call, in bytes over what it held before (``VmHWM`` /
  ``VmRSS``, the high-water mark reset by ``/proc/self/clear_refs``): what
  ``tracemalloc`` does not see (C++ allocations, the allocator's free pages);
* with ``--instructions``, the first call's instructions (callgrind,
  ``benchmarks/callgrind.py``: imports and the warm-up run uninstrumented),
  in a process of its own; load-independent, but about 50 times the
  first call's wall clock (minutes at N = 1000).

    python benchmarks/compile_cost.py [--mode native|backport|forced] [--n 1000]
                                      [--backend aot_eager] [--instructions] [--json OUT]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import callgrind  # noqa: E402  (benchmarks/, beside this script)
import workload  # noqa: E402


def package_of(filename: str) -> str:
    """The package a profiled function belongs to: ``torch_subclass_rt``
    (the workload's own subclass, ``examples``, apart: it is user code),
    ``torch.<subpackage>``, ``torch`` (its top-level modules), or ``other``
    (the standard library, builtins)."""
    path = filename.replace(os.sep, "/")
    if "/torch_subclass_rt/examples/" in path:
        return "the subclass (examples)"  # the workload's MeshTensor: user code
    if "/torch_subclass_rt/" in path:
        return "torch_subclass_rt"
    marker = "/site-packages/torch/"
    if marker in path:
        rest = path.split(marker, 1)[1]
        head = rest.split("/", 1)[0]
        return f"torch.{head}" if "/" in rest else "torch"
    return "other"


def first_call(n: int, subclass: bool, backend: str):
    import torch

    torch._dynamo.reset()
    xs = workload.inputs(n, "distinct", subclass=subclass, grad=True)
    fn = torch.compile(workload.fresh_fn("fwd+bwd", f"{'sub' if subclass else 'plain'}{n}"),
                       backend=backend)
    return workload.step("fwd+bwd", fn), xs


def _proc_status_bytes(field: str) -> int | None:
    """A ``kB`` field of /proc/self/status in bytes (None off Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Set the resident high-water mark to the current resident size
    (Linux >= 4.0: ``5`` into /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure(n: int, subclass: bool, backend: str) -> dict:
    row: dict = {"n": n, "inputs": "subclass" if subclass else "plain"}

    call, xs = first_call(n, subclass, backend)
    gc.collect()
    before = _proc_status_bytes("VmRSS")
    if before is not None and _reset_peak_rss():
        call(xs)
        row["rss_peak_bytes"] = _proc_status_bytes("VmHWM") - before
        row["rss_kept_bytes"] = _proc_status_bytes("VmRSS") - before
    del call, xs

    call, xs = first_call(n, subclass, backend)
    gc.collect()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    call(xs)
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    row["peak_bytes"] = peak - start
    row["kept_bytes"] = current - start

    call, xs = first_call(n, subclass, backend)
    gc.collect()
    profile = cProfile.Profile()
    profile.enable()
    call(xs)
    profile.disable()
    by_package: dict[str, dict[str, float]] = {}
    for (filename, _line, _name), (_cc, ncalls, tottime, _ct, _callers) in pstats.Stats(profile).stats.items():
        entry = by_package.setdefault(package_of(filename), {"calls": 0, "own_s": 0.0})
        entry["calls"] += ncalls
        entry["own_s"] += tottime
    row["by_package"] = dict(sorted(by_package.items(), key=lambda kv: -kv[1]["calls"]))
    return row


def format_rows(header: dict, rows: list[dict]) -> str:
    lines = [f"torch {header['torch']}, mode {header['mode']}, backend {header['backend']}, "
             "first call of fwd+bwd (distinct handles)"]
    for row in rows:
        lines.append(f"  N={row['n']} {row['inputs']}: heap peak {row['peak_bytes']:,} B, "
                     f"kept {row['kept_bytes']:,} B")
        if "rss_peak_bytes" in row:
            lines.append(f"    resident: peak +{row['rss_peak_bytes']:,} B, kept +{row['rss_kept_bytes']:,} B")
        if "instructions" in row:
            lines.append(f"    instructions: {row['instructions']:,}")
        total_calls = sum(v["calls"] for v in row["by_package"].values())
        total_s = sum(v["own_s"] for v in row["by_package"].values()) or 1.0
        for package, v in row["by_package"].items():
            if v["calls"] * 100 < total_calls:
                continue
            lines.append(f"    {package:28} {v['calls']:>11,} calls ({100 * v['calls'] / total_calls:4.1f} %)"
                         f"  own time {100 * v['own_s'] / total_s:4.1f} %")
        lines.append(f"    {'total':28} {total_calls:>11,} calls")
    return "\n".join(lines)


def _setup(mode: str | None, backend: str) -> dict:
    """Install for ``mode``; pay the one-time imports and caches (a first
    subclass compile imports more of torch than the plain one) outside
    every measured pass. Returns the header."""
    import torch

    import torch_subclass_rt as tsrt

    if mode in ("backport", "forced"):
        tsrt.install(force=mode == "forced")
    for subclass in (True, False):
        call, xs = first_call(2, subclass, backend)
        call(xs)
    return {"torch": torch.__version__, "mode": str(tsrt.status().mode), "backend": backend}


def child_main(args: argparse.Namespace) -> int:
    """Under callgrind: the first call at N, subclass then plain inputs,
    one region each."""
    child = callgrind.Child(args.request_fd, args.ack_dir)
    header = _setup(args.mode, args.backend)
    for subclass in (True, False):
        call, xs = first_call(args.n, subclass, args.backend)
        child.instrument(True)
        child.region("subclass" if subclass else "plain", call, xs)
        child.instrument(False)
        del call, xs
    child.finish({"header": header})
    return 0


def count_instructions(args: argparse.Namespace) -> dict[str, int]:
    argv = ["--n", str(args.n), "--backend", args.backend]
    if args.mode:
        argv += ["--mode", args.mode]
    _, ir = callgrind.run(__file__, argv)
    return ir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("native", "backport", "forced"))
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--instructions", action="store_true",
                        help="also count the first call's instructions under callgrind")
    parser.add_argument("--json", type=Path)
    callgrind.add_child_arguments(parser)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args)

    header = _setup(args.mode, args.backend)
    rows = [measure(args.n, subclass, args.backend) for subclass in (True, False)]
    if args.instructions:
        ir = count_instructions(args)
        for row in rows:
            row["instructions"] = ir[row["inputs"]]
    print(format_rows(header, rows))
    if args.json:
        args.json.write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
