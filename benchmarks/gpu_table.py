"""Per-call µs of the three forms on CUDA, with and without CUDA graphs.

One command, one table: ``benchmarks/attr_vs_context.py``'s three forms of
one wrapper subclass (``plain`` tensors, the mesh in the flatten ``context``,
the mesh an ``attr``), compiled with inductor in ``mode="default"`` and
``mode="reduce-overhead"`` (CUDA graphs), on 1 and 8 inputs per call: µs per
call after warm-up, median and min-max over ``--repeats`` samples of
``--calls`` calls, the graphs Dynamo compiled, and whether CUDA graphs ran:
the graphs captured (``torch.cuda.graph`` entered, counted around each case)
and inductor's ``cudagraph_*`` counters (``cudagraph_skips`` is the one that
says why a graph was not captured; the keys differ between releases, so
those present are printed). Then the demo's per-step time on the same device
(``python -m torch_subclass_rt demo --device cuda``). Sized to finish in
under 5 minutes on an H200 (not yet timed on one; the full CPU path, default
mode and the demo, took 43 s on the 2-core development machine).

    python benchmarks/gpu_table.py [--device cuda|cpu] [--n 1,8]
        [--compile-modes default,reduce-overhead] [--kinds fwd,fwd+bwd]
        [--calls 200] [--repeats 5] [--no-demo] [--json OUT]

On CPU (``--device cpu``, where the test runs it) reduce-overhead rows say
that CUDA graphs do not apply instead of measuring.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import attr_vs_context  # benchmarks/, beside this script (imports no torch)

ROOT = Path(__file__).resolve().parents[1]
COMPILE_MODES = ("default", "reduce-overhead")


@contextlib.contextmanager
def counting_captures():
    """Counts CUDA graph captures (every capture enters ``torch.cuda.graph``,
    inductor's CUDA graph trees included) while it is open."""
    import torch

    captured = [0]
    original = torch.cuda.graph.__enter__

    def enter(self):
        captured[0] += 1
        return original(self)

    torch.cuda.graph.__enter__ = enter
    try:
        yield captured
    finally:
        torch.cuda.graph.__enter__ = original


def _cudagraph_counters() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {k: v for k, v in counters["inductor"].items() if "cudagraph" in k}


def measure(kind: str, form: str, n: int, compile_mode: str, args: argparse.Namespace) -> dict:
    import torch
    from torch._dynamo.utils import counters

    row = {"kind": kind, "form": form, "n": n, "compile_mode": compile_mode}
    if compile_mode == "reduce-overhead" and args.device != "cuda":
        row["skipped"] = "CUDA graphs do not apply on CPU"
        return row
    torch._dynamo.reset()
    case = attr_vs_context.Case(kind, form, args.k, n, args.device, "inductor",
                                options={"mode": compile_mode})
    before_counters = _cudagraph_counters()
    before_graphs = counters["stats"]["unique_graphs"]
    with counting_captures() if args.device == "cuda" else contextlib.nullcontext([0]) as captured:
        case.compile()
        t0 = time.perf_counter()
        case.first_calls()
        case.sync()
        row["first_calls_s"] = time.perf_counter() - t0
        same = case.check_meshes()
        row["callers_mesh"] = all(same) if same else None
        case.calls(max(3, args.calls // 10) * args.k)  # warm up (CUDA graphs record here)
        row["per_call_us"] = [attr_vs_context.timed_us(case, args.calls) for _ in range(args.repeats)]
    row["compiles"] = counters["stats"]["unique_graphs"] - before_graphs
    row["captures"] = captured[0]
    after = _cudagraph_counters()
    row["cudagraph_counters"] = {k: after[k] - before_counters.get(k, 0) for k in after}
    return row


def run_demo(device: str, timeout: float) -> dict:
    """The demo's compiled per-step time (ms) on ``device``, as it prints it."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch_subclass_rt", "demo", "--device", device],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])},
    )
    found = re.search(r"eager ([\d.]+) ms, compiled ([\d.]+) ms", proc.stdout)
    if proc.returncode != 0 or found is None:
        return {"failed": (proc.stdout + proc.stderr)[-2000:]}
    return {"eager_ms": float(found[1]), "compiled_ms": float(found[2]),
            "line": next(line for line in proc.stdout.splitlines() if "time per step" in line)}


def table(info: dict, rows: list[dict], demo: dict | None) -> str:
    lines = [f"{info['config']} on {info['device_name']}; inductor; {info['k']} mesh(es); "
             f"{info['calls']} calls per sample, {info['repeats']} samples",
             f"{'mode':<16} {'kind':<8} {'n':>2} {'form':<8} {'us/call, median (min-max)':>27} "
             f"{'compiles':>8} {'captures':>8} {'mesh':>6}  cudagraph counters"]
    for r in rows:
        head = f"{r['compile_mode']:<16} {r['kind']:<8} {r['n']:>2} {r['form']:<8}"
        if "skipped" in r:
            lines.append(f"{head} {'n/a: ' + r['skipped']}")
            continue
        us = r["per_call_us"]
        spread = f"{statistics.median(us):.1f} ({min(us):.1f}-{max(us):.1f})"
        counters = ", ".join(f"{k} {v}" for k, v in sorted(r["cudagraph_counters"].items())) or "-"
        mesh = {True: "caller", False: "copy", None: "-"}[r["callers_mesh"]]
        lines.append(f"{head} {spread:>27} {r['compiles']:>8} {r['captures']:>8} {mesh:>6}  "
                     f"{counters}")
    lines.append("(captures: CUDA graphs captured while the case ran; 0 under reduce-overhead "
                 "means they did not run, cudagraph_skips says why)")
    lines.append("(mesh: forward outputs carry the caller's mesh object, or an equal copy: the "
                 "context form's graph from inductor's AOTAutograd cache)")
    if demo is not None:
        if "failed" in demo:
            lines.append(f"demo on {info['device']}: FAILED\n{demo['failed']}")
        else:
            lines.append(f"demo on {info['device']}: {demo['line'].strip()}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--mode", choices=["native", "backport", "forced"])
    parser.add_argument("--n", type=lambda s: [int(v) for v in s.split(",")], default=[1, 8])
    parser.add_argument("--compile-modes", type=lambda s: s.split(","), default=list(COMPILE_MODES))
    parser.add_argument("--kinds", type=lambda s: s.split(","), default=list(attr_vs_context.KINDS))
    parser.add_argument("--forms", type=lambda s: s.split(","), default=list(attr_vs_context.FORMS))
    parser.add_argument("--k", type=int, default=1, help="distinct meshes the calls cycle over")
    parser.add_argument("--calls", type=int, default=200, help="calls per timed sample")
    parser.add_argument("--repeats", type=int, default=5, help="timed samples per case")
    parser.add_argument("--no-demo", dest="demo", action="store_false")
    parser.add_argument("--demo-timeout", type=float, default=300.0)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    for mode in args.compile_modes:
        if mode not in COMPILE_MODES:
            parser.error(f"--compile-modes: {' or '.join(COMPILE_MODES)}, got {mode!r}")
    for kind in args.kinds:
        if kind not in attr_vs_context.KINDS:
            parser.error(f"--kinds: {' or '.join(attr_vs_context.KINDS)}, got {kind!r}")
    for form in args.forms:
        if form not in attr_vs_context.FORMS:
            parser.error(f"--forms: {', '.join(attr_vs_context.FORMS)}, got {form!r}")
    sys.path.insert(0, str(ROOT))
    import torch

    import torch_subclass_rt as tsrt

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (--device cpu runs the CPU path)")
    mode = args.mode or ("native" if tsrt._torch_compat.has_native_support() else "backport")
    t0 = time.monotonic()
    config = attr_vs_context.setup(mode, args.k)
    info = {"config": config, "device": args.device, "k": args.k, "calls": args.calls,
            "repeats": args.repeats,
            "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "CPU"}
    rows = []
    for compile_mode in args.compile_modes:
        for kind in args.kinds:
            for n in args.n:
                for form in args.forms:
                    rows.append(measure(kind, form, n, compile_mode, args))
                    print(f"  {compile_mode} {kind} n={n} {form} done "
                          f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
    demo = run_demo(args.device, args.demo_timeout) if args.demo else None
    print(table(info, rows, demo))
    print(f"({time.monotonic() - t0:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({"info": info, "rows": rows, "demo": demo},
                                              indent=1) + "\n")
    return 1 if demo is not None and "failed" in demo else 0


if __name__ == "__main__":
    sys.exit(main())
