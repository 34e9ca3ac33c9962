"""The subclass workload every benchmark here measures.

``n`` inputs, each a ``MeshTensor`` (a wrapper subclass whose inner attrs
are a tensor and a ``MeshHandle`` opaque) or a plain tensor of the same
shape; a compiled function of all of them, forward only ("fwd") or forward
and backward ("fwd+bwd"). The opaques are one handle shared by every input
("shared") or one per input ("distinct"). benchmarks/instructions.py counts
its per-call instructions (and gates them), scaling.py times it and
profile_per_input.py profiles it: one definition, so their figures are of
the same program. Imports no torch at module level.
"""

from __future__ import annotations

import re
import types
from typing import Any, Callable

KINDS = ("fwd", "fwd+bwd")


def _forward(xs):
    return [x * 2 + 1 for x in xs]


def _forward_backward(xs):
    return sum((x * 2 + 1).sum() for x in xs)


def fresh_fn(kind: str, tag: str) -> Callable:
    """The function of ``kind`` under a new code object named after ``tag``:
    Dynamo's cache is per code object, so the subclass and plain variants
    never check each other's guards (as two different user functions would
    not)."""
    template = _forward if kind == "fwd" else _forward_backward
    code = template.__code__.replace(co_name=re.sub(r"\W", "_", f"{template.__name__}_{tag}"))
    return types.FunctionType(code, template.__globals__, code.co_name)


def inputs(n: int, opaques: str, subclass: bool, grad: bool) -> list[Any]:
    """``n`` inputs of 8 elements: MeshTensors (``subclass``) or plain tensors."""
    import torch

    from torch_subclass_rt.examples.mesh_tensor import MeshHandle, MeshTensor

    shared = MeshHandle("shared")
    xs = []
    for i in range(n):
        local = torch.randn(8, requires_grad=grad)
        if subclass:
            local = MeshTensor(local, shared if opaques == "shared" else MeshHandle(f"m{i}"))
        xs.append(local)
    return xs


def step(kind: str, compiled: Callable) -> Callable:
    """One call of the workload: the compiled function, and for "fwd+bwd"
    its backward (grads cleared, so every call does the same work)."""
    if kind == "fwd":
        return compiled

    def fwd_bwd(xs):
        compiled(xs).backward()
        for x in xs:
            x.grad = None

    return fwd_bwd
