"""Random cases for the differential suite: subclasses, opaques, programs.

A case is plain data (:class:`Case`): the inputs (plain tensors or
``FuzzTensor`` wrappers with 1-2 inner tensors and 0-3 reference opaques,
optionally nested in a second ``FuzzTensor``), which opaque *label* each
opaque slot holds (equal labels = one shared object), what the context
holds (a value-type opaque or a constant), which inputs require grad or are
marked dynamic, and the compiled function as Python source. Everything a
run needs is rebuilt from the case, so :func:`reproducer` prints a script
that replays it.

Built with hypothesis strategies (:func:`cases`); nothing here imports
torch_subclass_rt's internals, only its public opaque API.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

import torch
from hypothesis import strategies as st
from torch.utils._pytree import tree_leaves, tree_map_only

import torch_subclass_rt as tsrt

# --------------------------------------------------------------------------
# the subclass and the opaques


class Handle(tsrt.OpaqueBase):
    """Reference-type opaque: compared by identity only."""

    def __init__(self, label: str) -> None:
        self.label = label

    def __repr__(self) -> str:
        return f"Handle({self.label!r})"


class Scale(tsrt.OpaqueBase):
    """Value-type opaque for the context (compared by value)."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Scale) and self.factor == other.factor

    def __hash__(self) -> int:
        return hash(self.factor)

    def __repr__(self) -> str:
        return f"Scale({self.factor!r})"

    def __fx_repr__(self):
        return f"Scale({self.factor!r})", {"Scale": Scale}


for _cls, _typ in ((Handle, "reference"), (Scale, "value")):
    if not tsrt._torch_compat.is_registered_opaque_type(_cls):
        tsrt.register_opaque(_cls, typ=_typ)


class FuzzTensor(torch.Tensor):
    """Wrapper subclass: inner tensors ``t0``[, ``t1``], reference opaques
    ``o0``..``o2`` among the inner attrs, ``ctx`` (a Scale or an int) in the
    flatten context. Ops run per inner tensor (like TwoTensor); outputs carry
    the first FuzzTensor argument's opaques and context; in-place ops return
    the mutated first argument."""

    @staticmethod
    def __new__(cls, tensors, opaques, ctx):
        t = tensors[0]
        return torch.Tensor._make_wrapper_subclass(
            cls,
            t.size(),
            strides=t.stride(),
            storage_offset=t.storage_offset(),
            dtype=t.dtype,
            device=t.device,
            requires_grad=t.requires_grad,
        )

    def __init__(self, tensors, opaques, ctx):
        self.n_tensors = len(tensors)
        self.n_opaques = len(opaques)
        for i, t in enumerate(tensors):
            setattr(self, f"t{i}", t)
        for i, o in enumerate(opaques):
            setattr(self, f"o{i}", o)
        self.ctx = ctx

    def tensors(self):
        return [getattr(self, f"t{i}") for i in range(self.n_tensors)]

    def opaques(self):
        return [getattr(self, f"o{i}") for i in range(self.n_opaques)]

    def __repr__(self) -> str:
        return f"FuzzTensor({self.tensors()}, {self.opaques()}, {self.ctx})"

    def __tensor_flatten__(self):
        names = [f"t{i}" for i in range(self.n_tensors)]
        names += [f"o{i}" for i in range(self.n_opaques)]
        return names, (self.n_tensors, self.n_opaques, self.ctx)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        n_t, n_o, ctx = meta
        return FuzzTensor(
            [inner[f"t{i}"] for i in range(n_t)], [inner[f"o{i}"] for i in range(n_o)], ctx
        )

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        first = next(a for a in tree_leaves((args, kwargs)) if isinstance(a, FuzzTensor))
        outs = []
        for i in range(first.n_tensors):
            def pick(t, i=i):
                return t.tensors()[min(i, t.n_tensors - 1)]

            a, kw = tree_map_only(FuzzTensor, pick, (args, kwargs))
            outs.append(func(*a, **kw))
        if func._schema.is_mutable:
            return args[0]
        if isinstance(outs[0], torch.Tensor):
            return FuzzTensor(outs, first.opaques(), first.ctx)
        if isinstance(outs[0], (tuple, list)) and all(isinstance(o, torch.Tensor) for o in outs[0]):
            return type(outs[0])(
                FuzzTensor([o[j] for o in outs], first.opaques(), first.ctx)
                for j in range(len(outs[0]))
            )
        return outs[0]


# --------------------------------------------------------------------------
# cases


@dataclasses.dataclass
class InputSpec:
    kind: str                  # "plain" | "sub" | "nested"
    n_tensors: int = 1
    opaque_labels: tuple = ()  # label per opaque slot ("A", "B", ...)
    ctx: str = "int"           # "int" | "scale"
    requires_grad: bool = False
    dynamic: bool = False
    outer_labels: tuple = ()   # nested: opaques of the outer FuzzTensor
    cls: str = "fuzz"          # "sub" inputs: which subclass (see SUBCLASSES)


@dataclasses.dataclass
class Case:
    inputs: list
    shape: tuple
    source: str                # def fn(x0, x1, ...): ...
    backend: str = "aot_eager"
    backward: bool = True

    def describe(self) -> str:
        return repr(self)


def _labels(draw, n, pool):
    # distinct within one input: sharing is across inputs only (see
    # Note [Sharing within one input] in test_differential.py)
    return tuple(draw(st.permutations(pool))[:n])


def _logging_tensor(ts):
    from torch.testing._internal.logging_tensor import LoggingTensor

    return LoggingTensor(ts[0])


def _subclass_makers():
    """Subclasses without opaques for the transparency arm: name -> maker
    from the list of base tensors. torch.testing._internal's own traceable
    subclasses, a LoggingTensor (not traceable: Dynamo refuses it, and the
    error must be the same with install()), and ours with no opaques."""
    from torch.testing._internal.custom_tensor import ConstantExtraMetadataTensor
    from torch.testing._internal.subclasses import WrapperSubclass
    from torch.testing._internal.two_tensor import TwoTensor

    return {
        "two": lambda ts: TwoTensor(ts[0], ts[1]),
        "wrapper": lambda ts: WrapperSubclass(ts[0]),
        "constmeta": lambda ts: ConstantExtraMetadataTensor(ts[0]),
        "logging": _logging_tensor,
    }


TRANSPARENCY_CLASSES = ("fuzz", "two", "wrapper", "constmeta", "logging")


@st.composite
def input_spec(draw, pool, allow_opaques=True, classes=("fuzz",)):
    kind = draw(st.sampled_from(["plain", "sub", "sub", "nested"]))
    cls = draw(st.sampled_from(classes))
    if cls != "fuzz" and kind == "nested":
        kind = "sub"
    if kind == "plain":
        return InputSpec("plain", requires_grad=draw(st.booleans()))
    n_op = draw(st.integers(0, 3)) if allow_opaques else 0
    spec = InputSpec(
        kind,
        cls=cls,
        n_tensors=draw(st.integers(1, 2)),
        opaque_labels=_labels(draw, n_op, pool),
        ctx=draw(st.sampled_from(["int", "scale"])),
        requires_grad=draw(st.booleans()),
    )
    if kind == "nested" and allow_opaques and draw(st.booleans()):
        spec.outer_labels = (draw(st.sampled_from(
            [p for p in pool if p not in spec.opaque_labels])),)
    return spec


POINTWISE = ["{v}.sin()", "{v} * 2", "{v} + 1", "{v}.relu()", "{v} * {w}", "{v} + {w}", "{v} - {w}"]


@st.composite
def program(draw, specs, shape):
    """The compiled function's source: in-place ops on inputs first, then a
    short chain of pointwise ops, then terminal ops (reductions, views,
    matmul), returning a tuple (may include an input or an opaque)."""
    n = len(specs)
    args = [f"x{i}" for i in range(n)]
    lines = []
    # in-place ops on inputs that do not require grad
    for i, s in enumerate(specs):
        if not s.requires_grad and draw(st.integers(0, 3)) == 0:
            lines.append(f"{args[i]}.{draw(st.sampled_from(['add_(1.5)', 'mul_(2)']))}")
    vals = list(args)
    for k in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(POINTWISE))
        v, w = draw(st.sampled_from(vals)), draw(st.sampled_from(vals))
        lines.append(f"v{k} = " + op.format(v=v, w=w))
        vals.append(f"v{k}")
    outs = []
    for j in range(draw(st.integers(1, 3))):
        v = draw(st.sampled_from(vals[n:] or vals))
        terms = ["{v}", "{v}.sum()", "{v}.mean(0)", "{v}.view(-1)", "{v}.unsqueeze(0)"]
        if len(shape) == 2:
            terms += ["{v}.t()", "{v} @ {w}.t()", "{v}.sum(1)"]
        else:
            terms += ["({v} * {w}).sum()"]
        w = draw(st.sampled_from(vals))
        outs.append(draw(st.sampled_from(terms)).format(v=v, w=w))
    if draw(st.integers(0, 4)) == 0:
        outs.append(draw(st.sampled_from(args)))  # an input itself
    with_opaque = [
        (i, s) for i, s in enumerate(specs) if s.kind == "sub" and s.opaque_labels
    ]
    if with_opaque and draw(st.integers(0, 3)) == 0:
        i, s = draw(st.sampled_from(with_opaque))
        outs.append(f"{args[i]}.o{draw(st.integers(0, len(s.opaque_labels) - 1))}")
    body = "\n".join(lines + [f"return ({', '.join(outs)},)"])
    return f"def fn({', '.join(args)}):\n" + textwrap.indent(body, "    ")


@st.composite
def cases(draw, *, allow_opaques=True, inductor_share=0.1, classes=("fuzz",)):
    pool = ["A", "B", "C", "D"]
    specs = draw(st.lists(input_spec(pool, allow_opaques, classes), min_size=1, max_size=3))
    # mark_dynamic on dim 0 of every input or of none: inputs are combined
    # with each other, so a dynamic dim next to a static one of the same
    # size is specialized, which mark_dynamic rightly refuses.
    dynamic = draw(st.booleans())
    for s in specs:
        s.dynamic = dynamic
    shape = draw(st.sampled_from([(4,), (3, 4)]))
    backend = "inductor" if draw(st.floats(0, 1)) < inductor_share else "aot_eager"
    return Case(specs, shape, draw(program(specs, shape)), backend)


# --------------------------------------------------------------------------
# building inputs


def make_opaques(case: Case, tag: str = "", split: bool = False) -> dict:
    """Label -> Handle. ``split``: every slot gets its own object (breaks sharing)."""
    objs: dict = {}
    slot = 0
    for i, s in enumerate(case.inputs):
        for labels, where in ((s.opaque_labels, "in"), (s.outer_labels, "out")):
            for j, lab in enumerate(labels):
                key = (i, where, j) if split else lab
                if key not in objs:
                    objs[key] = Handle(f"{lab}{tag}#{slot}")
                    slot += 1
    return objs


def _slot_obj(objs, i, where, j, lab, split):
    return objs[(i, where, j) if split else lab]


def make_inputs(case: Case, data: list, objs: dict, split: bool = False) -> list:
    """Fresh input tensors from ``data`` (one list of base tensors per input)."""
    out = []
    for i, (s, ts) in enumerate(zip(case.inputs, data)):
        ctx = Scale(2.0) if s.ctx == "scale" else 3
        if s.kind == "plain":
            x = ts[0].clone()
        elif s.cls != "fuzz":
            x = _subclass_makers()[s.cls]([t.clone() for t in ts])
        else:
            ops = [_slot_obj(objs, i, "in", j, lab, split) for j, lab in enumerate(s.opaque_labels)]
            x = FuzzTensor([t.clone() for t in ts[: s.n_tensors]], ops, ctx)
            if s.kind == "nested":
                outer = [_slot_obj(objs, i, "out", j, lab, split) for j, lab in enumerate(s.outer_labels)]
                x = FuzzTensor([x], outer, ctx)
        if s.requires_grad:
            x.requires_grad_(True)
        out.append(x)
    return out


def make_data(case: Case, gen: torch.Generator) -> list:
    return [[torch.randn(case.shape, generator=gen) for _ in range(2)] for _ in case.inputs]


def compile_fn(case: Case) -> Any:
    scope: dict = {}
    exec(case.source, scope)  # noqa: S102 - our own generated source
    return scope["fn"]


def reproducer(case: Case, seed: Any, error: str, data_seed: int = 0, check: str = "check_case") -> str:
    import os

    return (
        f"\n=== differential case failed ({error}) ===\n"
        f"mode: TSRT_MODE={os.environ.get('TSRT_MODE', '')}, torch {torch.__version__}\n"
        f"hypothesis seed: {seed}\n"
        f"case: {case!r}\n"
        f"--- function ---\n{case.source}\n"
        "--- replay ---\n"
        "import sys; sys.path.insert(0, 'test'); sys.path.insert(0, 'test/differential')\n"
        "import harness; harness.setup_mode()\n"
        "import run_case\n"
        "from gen import Case, InputSpec\n"
        f"case = {case!r}\n"
        f"run_case.{check}(case, {data_seed})\n"
    )
