"""Property-based differential tests: opaque member values that change
between calls, with torch's default caches on (eager is the reference).

A wrapper subclass holds a reference opaque (a communicator handle
registered with ``guard_fn`` on its size) and divides every compute op's
result by the handle's size. Drawn per example: where the size is read
(a registered method or a plain attribute, in ``__torch_dispatch__``, in
the compiled function's body through Dynamo, or in both), a program of
compute ops (matmul, add, mul, sin, relu, tanh, sum over the last dim),
forward only or forward and backward, and the sizes of three calls (two of
them equal or not). Each call is compared with eager (values and grads);
then ``torch._dynamo.reset()`` and the same calls again, which Dynamo
compiles again and AOTAutogradCache serves from the entries the first round
saved (a warm start in this process: the cache is on disk): again equal to
eager, and a hit for every graph whose reads agree (counted, and required
in at least one example).

Native torch 2.12-2.14 hands a recompile the entry of another size (Note
[Opaque reads in the AOTAutograd cache]; pinned as torch's bug by
test/points/test_opaque_reads.py): in plain ``native`` mode the
examples run with AOTAutogradCache off (Note [Native AOTAutogradCache and
broken sharing] in test_differential.py), every other mode with it on.

Examples: ``TSRT_FUZZ_MEMBER_EXAMPLES`` (default 8; each compiles with
Inductor, several graphs); ``TSRT_FUZZ_SEED`` as the other arms.
``TSRT_FUZZ_MEMBER_CACHE=on`` keeps the cache on in plain native mode too,
to watch this arm find the native bug.
"""

from __future__ import annotations

import contextlib
import os
import unittest

import harness
import torch
from hypothesis import given, seed, settings
from hypothesis import strategies as st
from torch.utils._pytree import tree_map_only

import torch_subclass_rt as tsrt

from test_differential import SEED, Coverage, _SETTINGS, _no_trace_handler

MODE = harness.current_mode()
EXAMPLES = int(os.environ.get("TSRT_FUZZ_MEMBER_EXAMPLES", "8"))

#: where the handle's size is read
READS = ("dispatch-method", "dispatch-attr", "dynamo", "dispatch-and-dynamo")
OPS = ("matmul", "add", "mul", "sin", "relu", "tanh", "sum_last")


class Handle(tsrt.OpaqueBase):
    """A communicator handle: its size as a method and as an attribute."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.world = n

    def size(self) -> int:
        return self.n


tsrt.register_opaque(
    Handle, typ="reference", guard_fn=lambda h: [h.n],
    **harness.member_kwargs(size="USE_REAL", world="USE_REAL"),
)


def _divisor(h, how: str):
    return h.size() if how == "method" else h.world


class Averaged(torch.Tensor):
    """Written as users write them: no ``__repr__``; the reading style is a
    class attribute set per example (``read``: "method", "attr" or "none")."""

    read = "method"

    @staticmethod
    def __new__(cls, a, handle):
        return torch.Tensor._make_wrapper_subclass(
            cls, a.shape, dtype=a.dtype, device=a.device, requires_grad=a.requires_grad
        )

    def __init__(self, a, handle):
        self.a = a
        self.handle = handle

    def __tensor_flatten__(self):
        return ["a", "handle"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, size, stride):
        return Averaged(inner["a"], inner["handle"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        handle = next(x.handle for x in torch.utils._pytree.tree_leaves(args) if isinstance(x, Averaged))
        args, kwargs = tree_map_only(Averaged, lambda x: x.a, (args, kwargs or {}))
        out = func(*args, **kwargs)
        if cls.read == "none" or func._schema.is_mutable or _is_view(func):
            return tree_map_only(torch.Tensor, lambda o: Averaged(o, handle), out)
        d = _divisor(handle, cls.read)
        return tree_map_only(torch.Tensor, lambda o: Averaged(o / d, handle), out)


def _is_view(func) -> bool:
    # a view's result AOTAutograd may regenerate from its base: leave views
    # unscaled so that the program's values do not depend on that choice
    return any(a.alias_info is not None for a in func._schema.returns)


def _program(ops, dynamo_reads: bool):
    def f(x, w):
        y = x
        for op in ops:
            if op == "matmul":
                y = y @ w
            elif op == "add":
                y = y + x
            elif op == "mul":
                y = y * 3
            elif op == "sum_last":
                y = y.sum(dim=-1, keepdim=True) + x
            else:
                y = getattr(torch, op)(y)
        if dynamo_reads:
            # a member read by Dynamo: baked into the Dynamo graph
            y = y * x.handle.size()
        return y

    return f


@st.composite
def member_cases(draw):
    return {
        "reads": draw(st.sampled_from(READS)),
        "ops": tuple(draw(st.lists(st.sampled_from(OPS), min_size=1, max_size=3))),
        "backward": draw(st.booleans()),
        "sizes": tuple(draw(st.lists(st.sampled_from((1, 2, 4)), min_size=3, max_size=3))),
    }


def _cache_context():
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    stack = contextlib.ExitStack()
    # Note [Native AOTAutogradCache and broken sharing] (test_differential.py)
    on = MODE != "native" or os.environ.get("TSRT_FUZZ_MEMBER_CACHE") == "on"
    stack.enter_context(functorch_config.patch(enable_autograd_cache=on))
    stack.enter_context(inductor_config.patch({"fx_graph_cache": True, "fx_graph_remote_cache": False}))
    return stack


def _call(fn, case, n, x0, w):
    x = Averaged(x0.clone().requires_grad_(case["backward"]), Handle(n))
    out = fn(x, w)
    grad = None
    if case["backward"]:
        out.sum().backward()
        grad = x.grad.a if isinstance(x.grad, Averaged) else x.grad
    return (out.a if isinstance(out, Averaged) else out).detach(), grad


def check_member_case(case, hits: list) -> None:
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache

    reads = case["reads"]
    Averaged.read = {"dispatch-method": "method", "dispatch-attr": "attr"}.get(
        reads, "method" if reads == "dispatch-and-dynamo" else "none"
    )
    fn = _program(case["ops"], reads in ("dynamo", "dispatch-and-dynamo"))
    g = torch.Generator().manual_seed(0)
    x0, w = torch.randn(3, 4, generator=g), torch.randn(4, 4, generator=g)
    with fresh_cache(), _cache_context(), _no_trace_handler():
        for round_ in ("cold", "warm"):
            torch._dynamo.reset()
            counters.clear()
            compiled = torch.compile(fn, backend="inductor", fullgraph=True)
            for i, n in enumerate(case["sizes"]):
                want = _call(fn, case, n, x0, w)
                got = _call(compiled, case, n, x0, w)
                for what, a, b in (("output", got[0], want[0]), ("grad", got[1], want[1])):
                    if b is None:
                        continue
                    torch.testing.assert_close(
                        a, b, msg=lambda m: f"{round_} round, call {i} (size {n}), {what}: {m}"
                    )
            if round_ == "warm":
                hits.append(counters["aot_autograd"]["autograd_cache_hit"])


class TestDifferentialMemberValues(unittest.TestCase):
    def test_member_values_between_calls(self):
        cov = Coverage("member-values")
        hits: list = []

        @seed(SEED)
        @settings(**{**_SETTINGS, "max_examples": EXAMPLES})
        @given(member_cases())
        def run(case):
            cov.drawn([
                f"reads={case['reads']}", *(f"op={o}" for o in case["ops"]),
                "backward" if case["backward"] else "forward",
                "sizes-differ" if len(set(case["sizes"])) > 1 else "sizes-equal",
            ])
            try:
                check_member_case(case, hits)
            except Exception as e:
                cov.ended("failed")
                raise AssertionError(
                    f"member-values case {case} (TSRT_FUZZ_SEED={SEED}, mode {MODE}): {e}"
                ) from e
            cov.ended("checked")

        try:
            run()
        finally:
            Averaged.read = "method"
        cov.shapes["warm-hits"] += sum(hits)
        cov.finish(self)
        if MODE != "native" or os.environ.get("TSRT_FUZZ_MEMBER_CACHE") == "on":
            # the warm round loaded what the cold one saved
            self.assertGreater(sum(hits), 0, cov.line())


if __name__ == "__main__":
    unittest.main()
