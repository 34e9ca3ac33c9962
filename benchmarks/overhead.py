"""Per-call overhead of a compiled function on a subclass with an opaque attr.

Compares, in one process, the per-call time of the same ``aot_eager``-compiled
function called on a ``MeshTensor`` (local tensor + opaque mesh handle) and on
a plain tensor of the same shape. The ratio is what the subclass path (Dynamo
guards on the subclass, runtime unwrap, rebuilding the output subclass with
the runtime opaque) costs on top of the plain path.

    python benchmarks/overhead.py [--mode native|backport|forced|stock]
                                  [--subclass mesh|two_tensor] [--backward] [--calls N]

The mode defaults to backport on torch 2.11 and native on torch >= 2.12;
``stock`` leaves torch as it is (on 2.11 only ``--subclass two_tensor``
compiles then: a subclass without opaque attrs, torch's ``TwoTensor``, which
shows what the per-call path costs an ordinary subclass before and after
``install()``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import torch_subclass_rt as tsrt  # noqa: E402


def _per_call_us(call, arg, calls: int, repeats: int) -> float:
    for _ in range(200):  # warm up (compile happened before)
        call(arg)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            call(arg)
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["native", "backport", "forced", "stock"])
    parser.add_argument("--subclass", choices=["mesh", "two_tensor"], default="mesh")
    parser.add_argument(
        "--backward", action="store_true",
        help="time forward + backward of (x.sin() + 1).sum() instead of the forward alone",
    )
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    mode = args.mode or ("native" if tsrt._torch_compat.has_native_support() else "backport")
    if mode in ("backport", "forced"):
        tsrt.install(force=(mode == "forced"))

    torch.set_num_threads(1)

    def f(x):
        return (x.sin() + 1).sum() if args.backward else x.sin() + 1

    compiled_sub = torch.compile(f, backend="aot_eager", fullgraph=True)
    compiled_plain = torch.compile(f, backend="aot_eager", fullgraph=True)
    local = torch.randn(8, requires_grad=args.backward)
    if args.subclass == "mesh":
        from torch_subclass_rt.examples.mesh_tensor import MeshHandle, MeshTensor

        sub = MeshTensor(local, MeshHandle("bench"))
        out = compiled_sub(sub)
        assert type(out) is MeshTensor and out.mesh is sub.mesh
    else:
        from torch.testing._internal.two_tensor import TwoTensor

        sub = TwoTensor(local, torch.randn(8, requires_grad=args.backward))
        assert type(compiled_sub(sub)) is TwoTensor
    compiled_plain(local)

    def timed(compiled):
        if not args.backward:
            return compiled

        def step(x):
            compiled(x).backward()
            x.grad = None  # no eager grad accumulation in the timing

        return step

    # Interleave the two measurements so drift hits both alike.
    sub_us, plain_us = [], []
    for _ in range(3):
        sub_us.append(_per_call_us(timed(compiled_sub), sub, args.calls, args.repeats))
        plain_us.append(_per_call_us(timed(compiled_plain), local, args.calls, args.repeats))
    s, p = min(sub_us), min(plain_us)
    print(
        f"torch {tsrt.torch_version()} mode={mode}{' fwd+bwd' if args.backward else ''}: "
        f"{args.subclass} {s:.1f} us/call, "
        f"plain {p:.1f} us/call, ratio {s / p:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
