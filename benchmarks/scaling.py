"""Per-call cost of subclass inputs against their number N, subclass vs plain.

For each N (default 1, 10, 100, 1000) and each way of sharing the opaque
(``distinct``: one ``MeshHandle`` per input; ``shared``: one handle for all),
compiles with ``aot_eager`` (``--backend``) and times, in one process and
interleaved with the same function on plain tensors of the same shape:

* ``fwd``: ``[x * 2 + 1 for x in xs]``
* ``fwd+bwd``: ``sum((x * 2 + 1).sum() for x in xs).backward()`` (the sum is
  compiled, the backward runs the compiled backward; ``.grad`` is reset to
  ``None`` after each call for both kinds of input)
* ``compile``: the first call of ``fwd+bwd`` (trace, compile, one run);
  with ``--compile-repeats R``, the median of R first calls of fresh
  functions, subclass and plain in turn (one compile is a single sample,
  and at N = 1000 its ratio varies by 0.3 between runs).

Reported per N: subclass and plain µs per call, their ratio, and the extra
µs per subclass input, ``(subclass - plain) / N``.

    python benchmarks/scaling.py [--mode native|backport|forced] [--n 1,10,100,1000]
                                 [--calls K] [--repeats R] [--compile-repeats R]
                                 [--kinds fwd,fwd+bwd] [--json OUT] [--plot OUT.png]
    python benchmarks/scaling.py --combine RUN.json [RUN.json ...] [--plot OUT.png]

``--combine`` needs no torch: it reads the JSON of several runs (any torch
versions and modes), prints one table with the median over runs of each
figure per configuration and the ratios between the configurations, and
plots them. The plot needs matplotlib (``pip install -e .[bench]``); without
it the plot is skipped with a message. ``nox -s bench`` runs it all.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import workload  # benchmarks/, beside this script (imports no torch)

KINDS = workload.KINDS


def _timed(fn, xs, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(xs)
    return (time.perf_counter() - t0) / calls * 1e6


def measure(n: int, opaques: str, kind: str, calls: int, repeats: int, backend: str,
            compile_repeats: int = 1) -> dict:
    import torch

    grad = kind != "fwd"
    row: dict[str, Any] = {"n": n, "opaques": opaques, "kind": kind}
    steps = {}
    compile_s: dict[str, list[float]] = {"sub": [], "plain": []}
    inputs = {variant: workload.inputs(n, opaques, variant == "sub", grad) for variant in ("sub", "plain")}
    for r in range(compile_repeats):  # in turn, so drift hits both alike
        for variant in ("sub", "plain"):
            xs = inputs[variant]
            compiled = torch.compile(
                workload.fresh_fn(kind, f"{variant}-{n}-{opaques}-{kind}-{r}"), backend=backend,
                fullgraph=True,
            )
            step = workload.step(kind, compiled)
            t0 = time.perf_counter()
            step(xs)
            compile_s[variant].append(time.perf_counter() - t0)
            steps[variant] = (step, xs)
    for variant, samples in compile_s.items():
        row[f"compile_{variant}_s"] = statistics.median(samples)
        row[f"compile_{variant}_samples"] = samples
    if n and kind == "fwd":
        out = steps["sub"][0](steps["sub"][1])
        assert all(o.mesh is x.mesh for o, x in zip(out, steps["sub"][1]))
    # the per-call loop: scale calls down with N so every point takes similar time
    k = max(3, calls // max(1, n // 10))
    for variant in ("sub", "plain"):
        _timed(steps[variant][0], steps[variant][1], max(1, k // 5))  # warm up
    samples: dict[str, list[float]] = {"sub": [], "plain": []}
    for _ in range(repeats):  # interleaved, so drift hits both alike
        for variant in ("sub", "plain"):
            samples[variant].append(_timed(steps[variant][0], steps[variant][1], k))
    row["sub_us"] = min(samples["sub"])
    row["plain_us"] = min(samples["plain"])
    return row


def run(args: argparse.Namespace) -> list[dict]:
    import torch

    import torch_subclass_rt as tsrt

    mode = args.mode or ("native" if tsrt._torch_compat.has_native_support() else "backport")
    if mode in ("backport", "forced"):
        tsrt.install(force=(mode == "forced"))
    torch.set_num_threads(1)
    label = f"{tsrt.torch_version()} {mode}"
    # the first compile in a process pays one-time imports and caches: keep
    # it out of the first configuration's compile time
    for kind in KINDS:
        measure(1, "distinct", kind, 3, 1, args.backend)
        torch._dynamo.reset()
    rows = []
    for n in args.n:
        for opaques in args.opaques:
            for kind in args.kinds:
                row = measure(n, opaques, kind, args.calls, args.repeats, args.backend,
                              args.compile_repeats)
                row["config"] = label
                rows.append(row)
                torch._dynamo.reset()
                print(_fmt_row(row), flush=True)
    return rows


def _derived(row: dict) -> dict:
    return {
        **row,
        "ratio": row["sub_us"] / row["plain_us"],
        "extra_us": (row["sub_us"] - row["plain_us"]) / row["n"],
        "compile_ratio": row["compile_sub_s"] / row["compile_plain_s"],
    }


HEADER = (
    f"{'config':<16} {'N':>5} {'opaques':<8} {'kind':<8} {'sub us':>10} {'plain us':>10} "
    f"{'ratio':>6} {'extra us/in':>11} {'compile s':>9} {'c.ratio':>7}"
)


def _fmt_row(row: dict) -> str:
    d = _derived(row)
    return (
        f"{d['config']:<16} {d['n']:>5} {d['opaques']:<8} {d['kind']:<8} {d['sub_us']:>10.1f} "
        f"{d['plain_us']:>10.1f} {d['ratio']:>6.2f} {d['extra_us']:>11.2f} "
        f"{d['compile_sub_s']:>9.2f} {d['compile_ratio']:>7.2f}"
    )


def combine(runs: list[list[dict]]) -> list[dict]:
    """Median over runs of every figure, per (config, N, opaques, kind)."""
    groups: dict[tuple, list[dict]] = {}
    for rows in runs:
        for row in rows:
            key = (row["config"], row["n"], row["opaques"], row["kind"])
            groups.setdefault(key, []).append(_derived(row))
    out = []
    for key, rows in groups.items():
        merged = dict(zip(("config", "n", "opaques", "kind"), key))
        for field in ("sub_us", "plain_us", "compile_sub_s", "compile_plain_s",
                      "ratio", "extra_us", "compile_ratio"):
            values = [r[field] for r in rows]
            merged[field] = statistics.median(values)
            # the spread over runs goes with every wall-clock figure: on a
            # shared machine it is often larger than the differences
            merged[f"{field}_min"], merged[f"{field}_max"] = min(values), max(values)
        merged["runs"] = len(rows)
        out.append(merged)
    return out


def print_combined(rows: list[dict]) -> None:
    configs = sorted({r["config"] for r in rows})
    print(HEADER + f" {'runs':>4} {'extra us/in min-max':>20} {'c.ratio min-max':>16}")
    for r in sorted(rows, key=lambda r: (r["kind"], r["opaques"], r["n"], r["config"])):
        print(
            f"{r['config']:<16} {r['n']:>5} {r['opaques']:<8} {r['kind']:<8} {r['sub_us']:>10.1f} "
            f"{r['plain_us']:>10.1f} {r['ratio']:>6.2f} {r['extra_us']:>11.2f} "
            f"{r['compile_sub_s']:>9.2f} {r['compile_ratio']:>7.2f} {r['runs']:>4} "
            f"{r['extra_us_min']:>9.2f}-{r['extra_us_max']:<10.2f} "
            f"{r['compile_ratio_min']:>7.2f}-{r['compile_ratio_max']:<8.2f}"
        )
    print("(medians over the runs; min-max: the range over the same runs)")
    if len(configs) < 2:
        return
    base = configs[-1]
    by_key = {(r["config"], r["n"], r["opaques"], r["kind"]): r for r in rows}
    print(f"\nratios of each configuration to {base} (extra us per input; ratio; compile ratio):")
    for r in sorted(rows, key=lambda r: (r["kind"], r["opaques"], r["n"], r["config"])):
        if r["config"] == base:
            continue
        b = by_key.get((base, r["n"], r["opaques"], r["kind"]))
        if b is None:
            continue
        extra = r["extra_us"] / b["extra_us"] if b["extra_us"] > 0 else float("nan")
        print(
            f"  {r['config']:<16} N={r['n']:<5} {r['opaques']:<8} {r['kind']:<8} "
            f"extra/in {r['extra_us']:.2f} vs {b['extra_us']:.2f} ({extra:.2f}x)  "
            f"ratio {r['ratio']:.2f} vs {b['ratio']:.2f}  "
            f"compile ratio {r['compile_ratio']:.2f} vs {b['compile_ratio']:.2f}"
        )


def plot(rows: list[dict], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed (pip install -e .[bench]): no plot written to {path}")
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, kind in zip(axes[:2], KINDS):
        for (config, opaques) in sorted({(r["config"], r["opaques"]) for r in rows}):
            pts = sorted(
                (r["n"], r["extra_us"]) for r in rows
                if r["kind"] == kind and r["config"] == config and r["opaques"] == opaques
            )
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{config}, {opaques}")
        ax.set_xscale("log")
        ax.set_xlabel("subclass inputs N")
        ax.set_ylabel("extra µs per subclass input per call")
        ax.set_title(f"{kind}: (subclass - plain) / N")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[2]
    for (config, opaques) in sorted({(r["config"], r["opaques"]) for r in rows}):
        pts = sorted(
            (r["n"], r["compile_sub_s"]) for r in rows
            if r["kind"] == "fwd+bwd" and r["config"] == config and r["opaques"] == opaques
        )
        if pts:
            ax.plot(*zip(*pts), marker="o", label=f"{config}, {opaques} (subclass)")
    for config in sorted({r["config"] for r in rows}):
        pts = sorted(
            {(r["n"], r["compile_plain_s"]) for r in rows
             if r["kind"] == "fwd+bwd" and r["config"] == config and r["opaques"] == "distinct"}
        )
        if pts:
            ax.plot(*zip(*pts), linestyle="--", label=f"{config} (plain)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("subclass inputs N")
    ax.set_ylabel("first call fwd+bwd, s")
    ax.set_title("compile (first call)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["native", "backport", "forced"])
    parser.add_argument("--n", type=lambda s: [int(v) for v in s.split(",")],
                        default=[1, 10, 100, 1000])
    parser.add_argument("--opaques", type=lambda s: s.split(","), default=["distinct", "shared"])
    parser.add_argument("--calls", type=int, default=500,
                        help="calls per timed sample at N <= 10 (fewer for larger N)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compile-repeats", type=int, default=1,
                        help="first calls of fresh functions per variant; the compile figure is their median")
    parser.add_argument("--kinds", type=lambda s: s.split(","), default=list(KINDS),
                        help="fwd, fwd+bwd or both (default)")
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--json", help="write the rows of this run here")
    parser.add_argument("--plot", help="write a PNG plot here (needs matplotlib)")
    parser.add_argument("--combine", nargs="+", metavar="RUN_JSON",
                        help="merge earlier runs' JSON instead of measuring")
    args = parser.parse_args(argv)

    if args.combine:
        rows = combine([json.loads(Path(p).read_text()) for p in args.combine])
        print_combined(rows)
    else:
        for opaques in args.opaques:
            if opaques not in ("distinct", "shared"):
                parser.error(f"--opaques: distinct or shared, got {opaques!r}")
        for kind in args.kinds:
            if kind not in KINDS:
                parser.error(f"--kinds: {' or '.join(KINDS)}, got {kind!r}")
        if args.compile_repeats < 1:
            parser.error("--compile-repeats: at least 1")
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        print(HEADER, flush=True)
        rows = run(args)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.plot:
        plot(combine([rows]) if not args.combine else rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
