"""The mesh as an inner attr against the mesh in the flatten context.

What users do instead of an opaque inner attr is keep the mesh in the
``__tensor_flatten__`` context, in a spec that compares by value. This
measures the same wrapper subclass in three forms (``benchmarks/mesh_forms.py``:
``plain`` tensors, the mesh in the ``context``, the mesh an ``attr``) over k
distinct meshes of the same shape: the compiled function is called once per
mesh (its first calls: trace and compile where Dynamo needs to), then in turn
on every mesh. Per (kind, form, k):

* ``compiles``: graphs compiled by the k first calls, counted twice: calls of
  a counting wrapper around the backend, and Dynamo's
  ``counters["stats"]["unique_graphs"]`` (the two must agree);
* ``compile s``: wall seconds of the k first calls, median and min-max over
  ``--repeats`` fresh functions (wall clock: quoted with its spread);
* ``peak MiB`` / ``kept MiB``: Python heap allocated during the k first
  calls, at its peak and still held after them (``tracemalloc``, in a pass of
  its own, since tracing slows the compile down; native allocations such as
  tensor storage are not seen, and are the same for the three forms);
* per call after warm-up, the calls cycling over the k meshes (a context
  form's call checks the guards of the graphs compiled before its own):
  instructions under callgrind (CPU; ``benchmarks/callgrind.py``, ``--calls``
  per region rounded up to whole rounds over the meshes) and wall µs
  (``--timed-calls`` per sample), median and min-max over the repeats.

The workload is ``benchmarks/workload.py``'s: ``fwd`` ``[x * 2 + 1 for x in
xs]`` and ``fwd+bwd`` ``sum((x * 2 + 1).sum() for x in xs).backward()`` on
``--n`` inputs per call, all on the call's mesh, ``fullgraph=True``, one
thread. Dynamo's recompile limit (default 8) is raised above the largest k so
the context form compiles once per mesh; with the default limit (measured
once, ``default_limit`` in the JSON) its forward stops at the limit: past
it, a ``fullgraph=True`` frame raises instead of falling back to eager.

    python benchmarks/attr_vs_context.py [--mode native|backport|forced]
        [--k 1,4,16] [--n 1] [--kinds fwd,fwd+bwd] [--repeats 3] [--calls 5]
        [--timed-calls 200]
        [--device cpu|cuda] [--no-callgrind] [--json OUT]
    python benchmarks/attr_vs_context.py --profile fwd+bwd,1 [--mode M]
    python benchmarks/attr_vs_context.py --combine RUN.json [...] [--markdown] [--plot OUT.png]

Without valgrind (or with ``--no-callgrind``, or on CUDA) the instruction
column is left out. ``--profile KIND,K`` lists the Python calls per call
that differ between the attr and the context form (where one costs more).
``--combine`` needs no torch: it prints the runs of
several releases as one table and plots them (matplotlib).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable

import callgrind  # benchmarks/, beside this script (neither imports torch)
import workload

ROOT = Path(__file__).resolve().parents[1]
KINDS = workload.KINDS
FORMS = ("plain", "context", "attr")  # mesh_forms.FORMS, without importing torch
MIB = 1 << 20


# ------------------------------------------------------------ the workload


class _Counting:
    """A backend that counts the graphs it is handed, then compiles them
    with the real one."""

    def __init__(self, backend: str) -> None:
        import torch

        self.backend = torch._dynamo.lookup_backend(backend)
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return self.backend(gm, example_inputs)


class Case:
    """One (kind, form, k): the inputs on each of k meshes, and a fresh
    compiled function of them per :meth:`compile`."""

    def __init__(self, kind: str, form: str, k: int, n: int, device: str, backend: str,
                 options: dict | None = None) -> None:
        import mesh_forms

        self.kind, self.form, self.k, self.n = kind, form, k, n
        self.device, self.backend, self.options = device, backend, options or {}
        self.meshes = mesh_forms.meshes(k)
        self.batches = [mesh_forms.inputs(form, n, m, kind != "fwd", device) for m in self.meshes]
        self.fresh = 0
        self.step: Callable | None = None
        self.counting: _Counting | None = None

    def compile(self) -> None:
        """A new function (Dynamo's cache is per code object), not yet called."""
        import torch

        self.fresh += 1
        # a compile mode is inductor's own (torch.compile takes it only with
        # the backend's name): those graphs are counted by Dynamo alone
        self.counting = None if self.options else _Counting(self.backend)
        backend = self.counting or self.backend
        fn = workload.fresh_fn(self.kind, f"{self.form}_{self.k}_{self.fresh}")
        self.step = workload.step(self.kind, torch.compile(fn, backend=backend, fullgraph=True,
                                                           **self.options))

    def first_calls(self) -> None:
        """One call per mesh: the compiles."""
        for xs in self.batches:
            self.step(xs)

    def calls(self, count: int) -> None:
        """``count`` calls cycling over the meshes."""
        for i in range(count):
            self.step(self.batches[i % self.k])

    def check_meshes(self) -> list[bool]:
        """Forward outputs carry their inputs' mesh: the very object in the
        attr form (a graph input), an equal one in the context form (the
        graph's own, traced or, from inductor's AOTAutograd cache, unpickled).
        Returns, per mesh, whether the outputs carry the caller's object."""
        if self.kind != "fwd" or self.form == "plain":
            return []
        same = []
        for xs in self.batches:
            out = self.step(xs)
            assert all(o.mesh.name == x.mesh.name for o, x in zip(out, xs)), (self.form, self.k)
            same.append(all(o.mesh is x.mesh for o, x in zip(out, xs)))
        assert self.form != "attr" or all(same), (self.form, self.k)
        return same

    def sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()


def rounded_calls(calls: int, k: int) -> int:
    """``calls`` rounded up to whole rounds over the k meshes."""
    return k * math.ceil(calls / k)


def setup(mode: str, max_k: int) -> str:
    """install() where the mode needs it, one thread, the recompile limit
    above ``max_k``; returns the run's label."""
    import torch

    import torch_subclass_rt as tsrt

    if mode in ("backport", "forced"):
        tsrt.install(force=(mode == "forced"))
    torch.set_num_threads(1)
    global DEFAULT_RECOMPILE_LIMIT
    if DEFAULT_RECOMPILE_LIMIT is None:
        DEFAULT_RECOMPILE_LIMIT = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = max(DEFAULT_RECOMPILE_LIMIT, 2 * max_k)
    return f"{tsrt.torch_version()} {mode}"


#: Dynamo's recompile limit before setup() raised it
DEFAULT_RECOMPILE_LIMIT: int | None = None


def recompile_limit_probe(k: int, backend: str) -> dict:
    """The context form's forward on k meshes under Dynamo's default
    recompile limit: the graphs it compiles, the meshes it serves and what
    it raises (with ``fullgraph=True`` a frame past the limit cannot fall
    back to eager)."""
    import torch

    raised = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = DEFAULT_RECOMPILE_LIMIT
    torch._dynamo.reset()
    case = Case("fwd", "context", k, 1, "cpu", backend)
    case.compile()
    probe = {"limit": DEFAULT_RECOMPILE_LIMIT, "k": k, "error": None}
    served = 0
    try:
        for xs in case.batches:
            case.step(xs)
            served += 1
    except Exception as e:  # what the user sees is the finding
        probe["error"] = type(e).__name__
    finally:
        torch._dynamo.config.recompile_limit = raised
        torch._dynamo.reset()
    probe.update(graphs=case.counting.graphs, served=served)
    return probe


def warm_up(args: argparse.Namespace) -> None:
    """A process's first compile pays one-time imports and caches: paid here,
    outside every figure."""
    import torch

    for kind in args.kinds:
        for form in FORMS:
            case = Case(kind, form, 2, 1, args.device, args.backend)
            case.compile()
            case.first_calls()
            case.calls(4)
            torch._dynamo.reset()


def timed_us(case: Case, count: int) -> float:
    case.sync()
    t0 = time.perf_counter()
    case.calls(count)
    case.sync()
    return (time.perf_counter() - t0) / count * 1e6


def measure(case: Case, repeats: int, timed_calls: int) -> dict:
    """Compiles, compile seconds, memory and wall µs per call of one case."""
    from torch._dynamo.utils import counters

    import torch

    row: dict[str, Any] = {"kind": case.kind, "form": case.form, "k": case.k, "n": case.n}
    compile_s, graphs, unique = [], set(), set()
    for _ in range(repeats):
        torch._dynamo.reset()
        case.compile()
        before = counters["stats"]["unique_graphs"]
        case.sync()
        t0 = time.perf_counter()
        case.first_calls()
        case.sync()
        compile_s.append(time.perf_counter() - t0)
        graphs.add(case.counting.graphs)
        unique.add(counters["stats"]["unique_graphs"] - before)
    if len(graphs) != 1 or graphs != unique:
        raise AssertionError(f"{case.kind} {case.form} k={case.k}: the backend saw {graphs} "
                             f"graphs, Dynamo counted {unique} unique graphs over the repeats")
    row["compiles"] = graphs.pop()
    row["compile_s"] = compile_s
    same = case.check_meshes()
    row["callers_mesh"] = all(same) if same else None
    count = rounded_calls(timed_calls, case.k)
    case.calls(3 * case.k)  # warm up (Python's specializing interpreter too)
    row["per_call_us"] = [timed_us(case, count) for _ in range(repeats)]

    # memory: a pass of its own (tracing slows the compile down)
    torch._dynamo.reset()
    case.compile()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    case.first_calls()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    row["mem_peak_mib"] = (peak - start) / MIB
    row["mem_kept_mib"] = (current - start) / MIB
    torch._dynamo.reset()
    return row


def run(args: argparse.Namespace) -> tuple[dict, list[dict]]:
    import torch_subclass_rt as tsrt

    label = setup(args.mode, max(args.k))
    warm_up(args)
    rows = []
    for kind in args.kinds:
        for k in args.k:
            for form in args.forms:
                row = measure(Case(kind, form, k, args.n, args.device, args.backend),
                              args.repeats, args.timed_calls)
                row["calls"] = rounded_calls(args.calls, k)
                rows.append(row)
                print(_progress(row), file=sys.stderr, flush=True)
    info = {"config": label, "torch": tsrt.torch_version(), "mode": args.mode,
            "python": platform.python_version(), "device": args.device,
            "backend": args.backend, "n": args.n, "repeats": args.repeats}
    if max(args.k) > DEFAULT_RECOMPILE_LIMIT and "context" in args.forms:
        info["default_limit"] = recompile_limit_probe(max(args.k), args.backend)
    return info, rows


def _progress(row: dict) -> str:
    return (f"  {row['kind']:<8} {row['form']:<8} k={row['k']:<3} compiles {row['compiles']:<3} "
            f"{statistics.median(row['compile_s']):.2f} s, "
            f"{statistics.median(row['per_call_us']):.1f} us/call")


# ------------------------------------------------------ the callgrind child


def child_main(args: argparse.Namespace) -> int:
    import torch

    import torch_subclass_rt as tsrt

    child = callgrind.Child(args.request_fd, args.ack_dir)
    setup(args.mode, max(args.k))
    warm_up(args)
    for kind in args.kinds:
        for k in args.k:
            for form in args.forms:
                case = Case(kind, form, k, args.n, args.device, args.backend)
                case.compile()
                case.first_calls()
                case.calls(3 * k)  # warm up
                child.instrument(True)
                child.region(f"{kind}/{form}/{k}", case.calls, rounded_calls(args.calls, k))
                child.instrument(False)
                torch._dynamo.reset()
    child.finish({"torch": tsrt.torch_version()})
    return 0


def count_instructions(args: argparse.Namespace, rows: list[dict]) -> None:
    """Add instructions per call to ``rows`` (one callgrind child for all)."""
    argv = ["--mode", args.mode, "--k", ",".join(map(str, args.k)), "--n", str(args.n),
            "--kinds", ",".join(args.kinds), "--forms", ",".join(args.forms),
            "--calls", str(args.calls), "--backend", args.backend]
    _, ir = callgrind.run(__file__, argv)
    for row in rows:
        row["instr_per_call"] = ir[f"{row['kind']}/{row['form']}/{row['k']}"] / row["calls"]


# ---------------------------------------------------------------- profile


def _profile_key(code: tuple) -> str:
    """A profiled function, named so the two forms' runs line up: the
    subclass's methods and the workload's function by name alone (they live
    in different files and code objects), the rest by file and line."""
    import re

    path, line, name = code
    path = re.sub(r"#[0-9a-f]+", "", path)  # generated code: one per graph
    name = re.sub(r"_(context|attr)_\d+_\d+$", "", name)
    if path.endswith(("mesh_forms.py", "mesh_tensor.py", "workload.py")):
        return f"subclass/workload: {name}"
    if path.startswith("<eval_with_key"):
        return f"compiled graph: {name}"
    if path == "~":
        return f"builtin: {name}"
    return f"{path.split('site-packages/')[-1].split(str(ROOT) + '/')[-1]}:{line}({name})"


def profile_calls(args: argparse.Namespace, kind: str, k: int) -> str:
    """Python function calls per compiled call that differ between the
    attr and the context form (cProfile call counts: exact, unlike its
    times), for ``kind`` on k meshes."""
    import cProfile

    import torch

    setup(args.mode, k)
    count = rounded_calls(20, k)
    per_form = {}
    for form in ("context", "attr"):
        case = Case(kind, form, k, args.n, args.device, args.backend)
        case.compile()
        case.first_calls()
        case.calls(3 * k)
        profiler = cProfile.Profile()
        profiler.enable()
        case.calls(count)
        profiler.disable()
        calls: dict[str, float] = {}
        # per code object: pstats keys by (file, line, name), and the graphs
        # of the context form run generated code that shares all three
        for entry in profiler.getstats():
            code = entry.code
            label = ((code.co_filename, code.co_firstlineno, code.co_name)
                     if hasattr(code, "co_filename") else ("~", 0, str(code)))
            key = _profile_key(label)
            calls[key] = calls.get(key, 0) + entry.callcount / count
        per_form[form] = calls
        torch._dynamo.reset()
    attr, context = per_form["attr"], per_form["context"]
    diff = sorted(((attr.get(key, 0) - context.get(key, 0), key) for key in {*attr, *context}),
                  key=lambda d: (-abs(d[0]), d[1]))
    lines = [f"{kind}, k = {k}, {args.mode}: function calls per call, attr {sum(attr.values()):.1f}, "
             f"context {sum(context.values()):.1f}; those that differ (attr - context):"]
    lines += [f"  {d:+6.2f}  {key}" for d, key in diff if abs(d) > 0.01]
    return "\n".join(lines)


# ------------------------------------------------------------------ tables


def _spread(values: list[float], fmt: str) -> str:
    return (f"{format(statistics.median(values), fmt)} "
            f"({format(min(values), fmt)}-{format(max(values), fmt)})")


def table(info: dict, rows: list[dict]) -> str:
    instr = any("instr_per_call" in r for r in rows)
    head = (f"{'kind':<8} {'form':<8} {'k':>3} {'compiles':>8} {'compile s, median (min-max)':>28} "
            f"{'peak MiB':>8} {'kept MiB':>8}")
    if instr:
        head += f" {'instr/call':>10} {'x attr':>6}"
    head += f" {'us/call, median (min-max)':>26}"
    lines = [f"{info['config']} ({info['device']}, {info['backend']}, n = {info['n']} input(s) "
             f"per call, {info['repeats']} repeats, Python {info['python']})", head]
    by = {(r["kind"], r["form"], r["k"]): r for r in rows}
    for r in rows:
        line = (f"{r['kind']:<8} {r['form']:<8} {r['k']:>3} {r['compiles']:>8} "
                f"{_spread(r['compile_s'], '.2f'):>28} {r['mem_peak_mib']:>8.1f} "
                f"{r['mem_kept_mib']:>8.2f}")
        if instr:
            attr = by.get((r["kind"], "attr", r["k"]), {}).get("instr_per_call")
            ratio = f"{r['instr_per_call'] / attr:.3f}" if attr else "-"
            line += f" {r['instr_per_call'] / 1e3:>8.1f} k {ratio:>6}"
        line += f" {_spread(r['per_call_us'], '.1f'):>26}"
        lines.append(line)
    notes = ["compiles: graphs the k first calls compiled (backend calls = Dynamo's unique_graphs);",
             "peak / kept MiB: Python heap (tracemalloc) during / after the k first calls;",
             "instr/call: callgrind, calls cycling over the k meshes; x attr: / the attr form's"]
    probe = info.get("default_limit")
    if probe:
        notes.append(f"context form, fwd, k = {probe['k']}, Dynamo's default recompile_limit "
                     f"({probe['limit']}): {probe['graphs']} graphs, {probe['served']} meshes "
                     f"served, then {probe['error'] or 'no error'}; the rows above raise the "
                     "limit above k")
    return "\n".join(lines + [f"({n})" for n in notes])


def markdown(runs: list[tuple[dict, list[dict]]]) -> str:
    """The runs as Markdown tables, one column per torch and mode. Several
    runs of one configuration: instruction cells list each run's figure
    (their agreement is the repeatability); wall clock and memory are the
    last run's."""
    configs: dict[str, list[list[dict]]] = {}
    probes: dict[str, dict] = {}
    for info, rows in runs:
        configs.setdefault(info["config"], []).append(rows)
        if info.get("default_limit"):
            probes[info["config"]] = info["default_limit"]
    names = list(configs)
    by = {c: [{(r["kind"], r["form"], r["k"]): r for r in rows} for rows in configs[c]]
          for c in names}
    keys = [(r["kind"], r["form"], r["k"]) for r in runs[0][1]]
    keys.sort(key=lambda key: (KINDS.index(key[0]), key[2], FORMS.index(key[1])))

    def tab(title: str, cell) -> list[str]:
        out = [title, "", "| kind | k | form | " + " | ".join(names) + " |",
               "|---|---|---|" + "---|" * len(names)]
        for key in keys:
            cells = [cell(c, key) for c in names]
            out.append(f"| {key[0]} | {key[2]} | {key[1]} | " + " | ".join(cells) + " |")
        return out + [""]

    def instr(c: str, key) -> str:
        figs = [run[key].get("instr_per_call") for run in by[c] if key in run]
        attr = [run[(key[0], "attr", key[2])].get("instr_per_call") for run in by[c]
                if (key[0], "attr", key[2]) in run]
        if not figs or None in figs:
            return "-"
        ratio = f" ({statistics.median(figs) / statistics.median(attr):.3f}x)" if all(attr) else ""
        return " / ".join(f"{f / 1e3:.1f}" for f in figs) + f" k{ratio}"

    def compiles(c: str, key) -> str:
        r = by[c][-1][key]
        return f"{r['compiles']}: {_spread(r['compile_s'], '.2f')} s"

    def memory(c: str, key) -> str:
        r = by[c][-1][key]
        return f"{r['mem_peak_mib']:.1f} / {r['mem_kept_mib']:.2f}"

    lines = tab("Instructions per call after warm-up, the calls cycling over the k meshes "
                "(callgrind; in brackets: / the attr form's):", instr)
    lines += tab("Graphs compiled by the first call on each of the k meshes, and those k calls' "
                 "wall seconds, median (min-max):", compiles)
    lines += tab("Python heap during the k first calls, peak / still held after them, MiB "
                 "(tracemalloc):", memory)
    for c, p in probes.items():
        lines.append(f"{c}, context form, fwd, k = {p['k']}, Dynamo's default recompile_limit "
                     f"({p['limit']}): {p['graphs']} graphs, {p['served']} meshes served, then "
                     f"{p['error'] or 'no error'}.  ")
    return "\n".join(lines)


def plot(runs: list[tuple[dict, list[dict]]], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed (pip install -e .[bench]): no plot written to {path}")
        return
    panels = [("compiles", "graphs compiled for k meshes", lambda r: r["compiles"]),
              ("compile_s", "first calls on k meshes, s (median)",
               lambda r: statistics.median(r["compile_s"])),
              ("mem_peak_mib", "Python heap peak while compiling, MiB", lambda r: r["mem_peak_mib"]),
              ("instr_per_call", "thousand instructions per call (callgrind)",
               lambda r: r["instr_per_call"] / 1e3 if "instr_per_call" in r else None)]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    axes = axes.flatten()
    styles = ["-", "--", ":", "-."]
    colors = {"plain": "tab:gray", "context": "tab:red", "attr": "tab:blue"}
    for ax, (_key, title, value) in zip(axes, panels):
        for (info, rows), style in zip(runs, styles):
            for form in FORMS:
                pts = sorted((r["k"], value(r)) for r in rows
                             if r["form"] == form and r["kind"] == "fwd+bwd"
                             and value(r) is not None)
                if pts:
                    ax.plot(*zip(*pts), marker="o", linestyle=style, color=colors[form],
                            label=f"{info['config']}, {form}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("distinct meshes k")
        ax.set_title(f"fwd+bwd: {title}", fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot written to {path}")


# -------------------------------------------------------------------- main


def _ints(s: str) -> list[int]:
    return [int(v) for v in s.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["native", "backport", "forced"])
    parser.add_argument("--k", type=_ints, default=[1, 4, 16], help="distinct meshes (default 1,4,16)")
    parser.add_argument("--n", type=int, default=1, help="subclass inputs per call (default 1)")
    parser.add_argument("--kinds", type=lambda s: s.split(","), default=list(KINDS))
    parser.add_argument("--forms", type=lambda s: s.split(","), default=list(FORMS))
    parser.add_argument("--repeats", type=int, default=3,
                        help="fresh compiles and timed samples per case (default 3)")
    parser.add_argument("--calls", type=int, default=5,
                        help="calls per measured region, rounded up to whole rounds over the "
                             "meshes (default 5)")
    parser.add_argument("--timed-calls", type=int, default=200,
                        help="calls per wall-clock sample, rounded up likewise (default 200)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--no-callgrind", dest="callgrind", action="store_false",
                        help="no instruction counts (they are skipped anyway without valgrind)")
    parser.add_argument("--json", help="write this run here")
    parser.add_argument("--combine", nargs="+", metavar="RUN_JSON",
                        help="print and plot earlier runs instead of measuring")
    parser.add_argument("--plot", help="write a PNG plot here (needs matplotlib)")
    parser.add_argument("--markdown", action="store_true",
                        help="with --combine: the runs as Markdown tables, a column per release")
    parser.add_argument("--profile", metavar="KIND,K",
                        help="instead of measuring: the Python calls per call that differ "
                             "between the attr and the context form (cProfile), e.g. fwd+bwd,1")
    callgrind.add_child_arguments(parser)
    args = parser.parse_args(argv)
    for kind in args.kinds:
        if kind not in KINDS:
            parser.error(f"--kinds: {' or '.join(KINDS)}, got {kind!r}")
    for form in args.forms:
        if form not in FORMS:
            parser.error(f"--forms: {', '.join(FORMS)}, got {form!r}")
    if min(args.k) < 1 or min(args.n, args.repeats, args.calls, args.timed_calls) < 1:
        parser.error("--k, --n, --repeats, --calls and --timed-calls: at least 1")
    sys.path.insert(0, str(ROOT))
    if args.child:
        return child_main(args)
    if args.combine:
        runs = [tuple(json.loads(Path(p).read_text())) for p in args.combine]
        if args.markdown:
            print(markdown(runs))
        else:
            print("\n\n".join(table(info, rows) for info, rows in runs))
        if args.plot:
            plot(runs, args.plot)
        return 0
    if args.mode is None:
        import torch_subclass_rt as tsrt

        args.mode = "native" if tsrt._torch_compat.has_native_support() else "backport"
    if args.profile:
        kind, k = args.profile.split(",")
        print(profile_calls(args, kind, int(k)))
        return 0
    t0 = time.monotonic()
    info, rows = run(args)
    if args.callgrind and args.device == "cpu":
        if callgrind.available():
            count_instructions(args, rows)
        else:
            print("valgrind is not installed: no instruction counts", file=sys.stderr)
    info["took_s"] = round(time.monotonic() - t0, 1)
    print(table(info, rows))
    print(f"({info['took_s']:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps([info, rows], indent=1) + "\n")
    if args.plot:
        plot([(info, rows)], args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
