"""Where the per-input cost of a subclass input goes, per call.

Runs ``sum((x * 2 + 1).sum() for x in xs).backward()`` (``--kind fwd+bwd``)
or ``[x * 2 + 1 for x in xs]`` (``--kind fwd``) compiled with ``aot_eager``
on N ``MeshTensor``s (distinct handles) and on N plain tensors, and breaks
the difference down into

* Dynamo's guards on the inputs: the compiled function's guard manager is
  called on its own (it is C++, but a subclass's guards call its Python
  ``__tensor_flatten__``), subclass vs plain;
* by ``cProfile``, per call and per input: ``__tensor_flatten__`` (guards,
  tangent processing), the forward's unwrap/wrap wrapper (its own time),
  ``__tensor_unflatten__`` / wrapper creation, tangent processing, the
  backward's grad rebuild (its own time), the subclass's
  ``__torch_dispatch__`` (eager ops on subclasses: the loss's ``ones_like``
  in ``.backward()``, grad accumulation), and the calls of each;
* the rest: torch's own per-call code that differs for a subclass (autograd
  engine, ``autograd.Function`` bookkeeping, C++ dispatch).

The cProfile times carry the profiler's own overhead (each Python call costs
more under it), so the shares are what to read; the total extra per input is
measured without the profiler.

    python benchmarks/profile_per_input.py [--mode native|backport] [--n 100]
                                           [--kind fwd|fwd+bwd] [--calls K]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import scaling  # noqa: E402
import workload  # noqa: E402


def _is(func, names, file_part=""):
    filename, _, name = func
    return name in names and file_part in filename


#: (row label, predicate on a pstats function key, which time)
#: "own": time in the function itself; "cum": including everything it calls
CATEGORIES = [
    ("__tensor_flatten__ (all callers)", lambda f: _is(f, {"__tensor_flatten__"}), "cum"),
    ("forward unwrap/wrap, own time",
     lambda f: _is(f, {"subclass_wrapper", "inner_fn"}, "codegen"), "own"),
    ("__tensor_unflatten__ + wrapper creation", lambda f: _is(f, {"__tensor_unflatten__"}), "cum"),
    ("tangent processing (incl. its flatten)",
     lambda f: _is(f, {"process_runtime_tangent"}), "cum"),
    ("grad rebuild, own time",
     lambda f: _is(f, {"wrap_tensor_subclasses", "creation_fn", "run_wrap", "wrap_fn",
                       "grad_wrapper", "_backward_epilogue_functional"}), "own"),
    ("subclass __torch_dispatch__ (eager ops)", lambda f: _is(f, {"__torch_dispatch__"}), "cum"),
]


def guard_us(compiled_code, xs, reps: int) -> float:
    """Time of the guard check of the one cache entry of ``compiled_code``."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    entries = _debug_get_cache_entry_list(compiled_code)
    if len(entries) != 1:
        raise AssertionError(f"expected one compiled entry, got {len(entries)}")
    manager = entries[0].guard_manager
    f_locals = {"xs": xs}
    if not manager.check(f_locals):
        raise AssertionError("the guards fail on the inputs they were compiled for")
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            manager.check(f_locals)
        best = min(best, (time.perf_counter() - t0) / reps * 1e6)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["native", "backport", "forced"])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--kind", choices=workload.KINDS, default="fwd+bwd")
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()

    import torch

    import torch_subclass_rt as tsrt

    mode = args.mode or ("native" if tsrt._torch_compat.has_native_support() else "backport")
    if mode in ("backport", "forced"):
        tsrt.install(force=(mode == "forced"))
    torch.set_num_threads(1)
    n, grad = args.n, args.kind != "fwd"

    steps, fns, inputs = {}, {}, {}
    for variant in ("sub", "plain"):
        xs = workload.inputs(n, "distinct", variant == "sub", grad)
        fn = workload.fresh_fn(args.kind, f"profile-{variant}")
        step = workload.step(args.kind, torch.compile(fn, backend="aot_eager", fullgraph=True))
        for _ in range(20):
            step(xs)
        steps[variant], fns[variant], inputs[variant] = step, fn, xs

    # whole-call extra per input, no profiler (best of interleaved samples)
    per_call = {"sub": float("inf"), "plain": float("inf")}
    for _ in range(5):
        for variant in per_call:
            per_call[variant] = min(
                per_call[variant], scaling._timed(steps[variant], inputs[variant], args.calls)
            )
    total_extra = (per_call["sub"] - per_call["plain"]) / n

    guards = {v: guard_us(fns[v].__code__, inputs[v], args.calls * 4) for v in ("sub", "plain")}

    # Python-level calls per call of the subclass step
    profiles = {}
    for variant in ("sub", "plain"):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            steps[variant](inputs[variant])
        prof.disable()
        profiles[variant] = pstats.Stats(prof).stats  # type: ignore[attr-defined]

    # which aten ops the subclass dispatches eagerly per call
    from torch_subclass_rt.examples.mesh_tensor import MeshTensor

    ops: collections.Counter = collections.Counter()
    original = MeshTensor.__dict__["__torch_dispatch__"]

    def counting(cls, func, types, args=(), kwargs=None):
        ops[str(func)] += 1
        return original.__func__(cls, func, types, args, kwargs)

    MeshTensor.__torch_dispatch__ = classmethod(counting)
    try:
        for _ in range(args.calls):
            steps["sub"](inputs["sub"])
    finally:
        MeshTensor.__torch_dispatch__ = original

    def scale(v: float) -> float:  # seconds over all calls -> us per call per input
        return v / args.calls / n * 1e6

    print(f"torch {tsrt.torch_version()} mode={mode} kind={args.kind} N={n}")
    print(f"per call: subclass {per_call['sub']:.0f} us, plain {per_call['plain']:.0f} us; "
          f"extra per subclass input {total_extra:.2f} us (no profiler)")
    print(f"{'component':<44} {'us/input/call':>13} {'calls/input/call':>16}")
    g = (guards["sub"] - guards["plain"]) / n
    print(f"{'Dynamo guards (guard manager alone)':<44} {g:>13.2f} {'':>16}")
    for label, pred, which in CATEGORIES:
        t = c = 0.0
        for func, (cc, nc, tt, ct, _callers) in profiles["sub"].items():
            if pred(func):
                t += tt if which == "own" else ct
                c += nc
        print(f"{label:<44} {scale(t):>13.2f} {c / args.calls / n:>16.2f}")
    tot = {v: sum(tt for (_cc, _nc, tt, _ct, _c) in profiles[v].values()) for v in profiles}
    print(f"{'profiled Python time, subclass - plain':<44} "
          f"{scale(tot['sub'] - tot['plain']):>13.2f} {'':>16}")
    print("eager aten ops on the subclass per call:",
          ", ".join(f"{k} x{v / args.calls:g}" for k, v in ops.most_common()) or "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
