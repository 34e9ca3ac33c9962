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
import re
import textwrap
from typing import Any

import torch
from hypothesis import strategies as st
from torch.utils._pytree import tree_leaves, tree_map_only

import fixtures
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
    defs: tuple = ()           # generated cases: SubclassDef of "sub" inputs[, of the nested outer]
    view_of_input: bool = False  # generated cases: an output is a view of an input

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


#: how a program reads the Scale in a FuzzTensor's flatten context
VALUE_READ = ".ctx.factor"

POINTWISE = ["{v}.sin()", "{v} * 2", "{v} + 1", "{v}.relu()", "{v} * {w}", "{v} + {w}", "{v} - {w}"]


@st.composite
def program(draw, specs, shape, opaque_attrs=None, value_reads=True):
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
    # a value-type opaque's attribute read in the compiled code: the Scale
    # in a FuzzTensor's flatten context (VALUE_READ; check_case calls again
    # with another factor). Not in the transparency arm: reading it is
    # what install() adds to 2.11 (points/value_opaque_attrs.py)
    readers = [i for i, s in enumerate(specs)
               if s.kind in ("sub", "nested") and s.cls == "fuzz" and s.ctx == "scale"] if value_reads else []
    if readers and draw(st.integers(0, 2)) == 0:
        i, v = draw(st.sampled_from(readers)), draw(st.sampled_from(vals))
        lines.append(f"vr = {v} * {args[i]}{VALUE_READ}")
        vals.append("vr")
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
        j = draw(st.integers(0, len(s.opaque_labels) - 1))
        outs.append(f"{args[i]}.{opaque_attrs[s.kind][j]}" if opaque_attrs else f"{args[i]}.o{j}")
    body = "\n".join(lines + [f"return ({', '.join(outs)},)"])
    return f"def fn({', '.join(args)}):\n" + textwrap.indent(body, "    ")


def _pick_backend(key: str, inductor_share: float) -> str:
    # Not ``st.floats(0, 1) < share``: hypothesis draws 0.0 (and other edge
    # values) far more often than uniformly, which made about half of all
    # cases inductor cases at a nominal 5% (and integer draws fed to a
    # Random gave none in 200). A hash of the case's own text is uniform
    # enough and deterministic; the Case records the backend for replay.
    import zlib

    return "inductor" if zlib.crc32(key.encode()) % 10000 < inductor_share * 10000 else "aot_eager"


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
    source = draw(program(specs, shape, value_reads=allow_opaques))
    return Case(specs, shape, source, _pick_backend(repr((specs, source)), inductor_share))


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
                    objs[key] = (opaque_for(lab, f"{tag}#{slot}") if case.defs
                                 else Handle(f"{lab}{tag}#{slot}"))
                    slot += 1
    return objs


def _slot_obj(objs, i, where, j, lab, split):
    return objs[(i, where, j) if split else lab]


def make_inputs(case: Case, data: list, objs: dict, split: bool = False, factor: float = 2.0) -> list:
    """Fresh input tensors from ``data`` (one list of base tensors per input);
    ``factor``: the Scale of a ``ctx="scale"`` input."""
    out = []
    for i, (s, ts) in enumerate(zip(case.inputs, data)):
        ctx = Scale(factor) if s.ctx == "scale" else 3
        if s.kind == "plain":
            x = ts[0].clone()
        elif s.cls == "gen":
            x = _make_generated(case, s, i, ts, objs, split)
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
    n = 4 if case.defs else 2  # generated: up to two inner instances of two tensors
    return [[torch.randn(case.shape, generator=gen) for _ in range(n)] for _ in case.inputs]


def _make_generated(case, s, i, ts, objs, split):
    d = case.defs[0]
    cls = define(d)
    ts = [t.clone() for t in ts]
    inner_ops = dict(zip(d.opaques, (_slot_obj(objs, i, "in", j, lab, split)
                                     for j, lab in enumerate(s.opaque_labels))))

    def one(tensors):
        tensors = list(tensors)
        return cls(*[tensors.pop(0) if a.startswith("t") else inner_ops[a] for a in d.attrs], 3)

    n = len(d.tensors)
    if s.kind != "nested":
        return one(ts[:n])
    nd = case.defs[1]
    outer_ops = dict(zip(nd.opaques, (_slot_obj(objs, i, "out", j, lab, split)
                                      for j, lab in enumerate(s.outer_labels))))
    inners = [one(ts[k * n:(k + 1) * n]) for k in range(len(nd.tensors))]
    return define(nd)(*[inners.pop(0) if a.startswith("t") else outer_ops[a] for a in nd.attrs], 3)


def compile_fn(case: Case) -> Any:
    # The source gets a file name that linecache knows, as a function
    # written in a .py file has: torch.compile on torch 2.10/2.11 wraps a
    # function without a source file in an extra frame
    # (external_utils.wrap_inline) whose fn(*args) fakeifies every input,
    # used or not, which no user's function sees (an unused _make_subclass
    # input was then refused on 2.10/2.11 and compiled on 2.12+).
    import hashlib
    import linecache

    filename = f"<tsrt-differential-{hashlib.sha1(case.source.encode()).hexdigest()[:12]}>.py"
    linecache.cache[filename] = (len(case.source), None, case.source.splitlines(True), filename)
    scope: dict = {}
    exec(compile(case.source, filename, "exec"), scope)  # noqa: S102 - our own generated source
    return scope["fn"]


def reproducer(case: Case, seed: Any, error: str, data_seed: int = 0, check: str = "check_case") -> str:
    import os

    return (
        f"\n=== differential case failed ({error}) ===\n"
        f"mode: TSRT_MODE={os.environ.get('TSRT_MODE', '')}, torch {torch.__version__}\n"
        f"hypothesis seed: {seed}\n"
        f"case: {case!r}\n"
        + "".join(f"--- subclass {d.name} (gen.define({d!r})) ---\n{class_source(d)}"
                  for d in case.defs)
        + f"--- function ---\n{case.source}\n"
        "--- replay ---\n"
        "import sys; sys.path.insert(0, 'test'); sys.path.insert(0, 'test/differential')\n"
        "import harness; harness.setup_mode()\n"
        "import run_case\n"
        "from gen import Case, InputSpec, SubclassDef\n"
        f"case = {case!r}\n"
        f"run_case.{check}(case, {data_seed})\n"
    )


# --------------------------------------------------------------------------
# generated subclass definitions (written as users write them)
#
# The cases above vary programs over one subclass (FuzzTensor), written with
# our own habits. A *generated* case also draws the subclass definitions:
# how the wrapper is made, whether it has a __repr__ / __torch_function__ /
# __coerce_tangent_metadata__, what its flatten context is, which opaques it
# holds and where they sit among the inner tensors, whether its dispatch
# reads a registered member of an opaque, and where the outer size/stride of
# an unflattened instance comes from. Each definition is Python source
# (:func:`class_source`), exec'd into a module of its own registered in
# sys.modules, so Dynamo, pickling and the replay snippet see a real class.


class Mesh(tsrt.OpaqueBase):
    """Reference opaque with a registered member ``k`` (USE_REAL) that
    generated dispatch may read (and check, not compute with); ``k``
    follows the label."""

    def __init__(self, label: str, k: int) -> None:
        self.label = label
        self.k = k

    def __repr__(self) -> str:
        return f"Mesh({self.label!r})"


class Group(tsrt.OpaqueBase):
    """A second reference opaque type, no members (a process-group handle)."""

    def __init__(self, label: str) -> None:
        self.label = label

    def __repr__(self) -> str:
        return f"Group({self.label!r})"


def _register_members_types() -> None:
    # members need torch >= 2.11, or install() on 2.10 (the harness installs
    # before importing this module in backport mode)
    from torch._library import opaque_object

    kwargs = {}
    if hasattr(opaque_object, "MemberType"):
        kwargs["members"] = {"k": opaque_object.MemberType.USE_REAL}
    if not tsrt._torch_compat.is_registered_opaque_type(Mesh):
        tsrt.register_opaque(Mesh, typ="reference", **kwargs)
    if not tsrt._torch_compat.is_registered_opaque_type(Group):
        tsrt.register_opaque(Group, typ="reference")


_register_members_types()

#: opaque attr name -> (type, label pool); labels of one input are distinct
OPAQUE_ATTRS = {"mesh": (Mesh, ("A", "B", "C")), "group": (Group, ("P", "Q", "R"))}


def opaque_for(label: str, tag: str) -> Any:
    if label in OPAQUE_ATTRS["group"][1]:
        return Group(f"{label}{tag}")
    return Mesh(f"{label}{tag}", k=1 + "ABC".index(label) % 2)


@dataclasses.dataclass(frozen=True)
class Meta:
    """A dataclass flatten context."""

    tag: int
    size: Any = None
    stride: Any = None


class Spec:
    """A DTensorSpec-like context: the instance keeps ``Spec(mesh, ...)``;
    its flatten context is the same spec with ``mesh=None`` (the mesh itself
    is an inner attr), and unflatten puts the inner attr's mesh back."""

    def __init__(self, mesh, tag, size=None, stride=None):
        self.mesh, self.tag, self.size, self.stride = mesh, tag, size, stride

    def _key(self):
        return (self.tag, self.size, self.stride)

    def __eq__(self, other):
        return isinstance(other, Spec) and self.mesh is other.mesh and self._key() == other._key()

    def __hash__(self):
        return hash((id(self.mesh), self._key()))

    def __repr__(self):
        return f"Spec(mesh={self.mesh!r}, tag={self.tag!r}, size={self.size!r}, stride={self.stride!r})"


@dataclasses.dataclass(frozen=True)
class SubclassDef:
    """One generated subclass definition (plain data; :func:`class_source`
    turns it into Python source)."""

    attrs: tuple               # flatten order: "t0", "t1", "mesh", "group"
    make: str = "wrapper"      # "wrapper" (_make_wrapper_subclass) | "subclass" (_make_subclass)
    repr: bool = True          # defines __repr__
    torch_function: str = "disabled"  # "disabled" | "inherited"
    ctx: str = "tuple"         # "none" | "tuple" | "dataclass" | "dict" | "spec"
    reads_members: bool = False  # dispatch reads mesh.k (a registered member)
    outer: str = "inner"       # outer size/stride: "inner" (recomputed) | "args" | "ctx"
    coerce: bool = False       # defines __coerce_tangent_metadata__
    checks_type: bool = False  # dispatch checks isinstance(opaque, its registered type)

    @property
    def tensors(self) -> tuple:
        return tuple(a for a in self.attrs if a.startswith("t"))

    @property
    def opaques(self) -> tuple:
        return tuple(a for a in self.attrs if not a.startswith("t"))

    @property
    def name(self) -> str:
        import hashlib

        return "Gen_" + hashlib.sha1(repr(self).encode()).hexdigest()[:10]


def class_source(d: SubclassDef) -> str:
    """The Python source of the class ``d`` describes (also printed by the
    reproducer). The constructor takes the inner tensors and opaques by attr
    name, then ``tag`` and optional outer ``size`` / ``stride``."""
    n = d.name
    params = ", ".join(d.attrs)
    ctx_expr = {
        "none": "None",
        "tuple": "(self.tag, {sz})",
        "dataclass": "gen.Meta(self.tag, {sz})",
        "dict": "{{'tag': self.tag, 'size': {s}, 'stride': {st}}}",
        "spec": "gen.Spec(None, self.tag, {sz})",
    }[d.ctx]
    in_ctx = d.outer == "ctx"
    s, st_ = ("tuple(self.size())", "tuple(self.stride())") if in_ctx else ("None", "None")
    ctx_expr = ctx_expr.format(sz=f"{s}, {st_}", s=s, st=st_)
    read_ctx = {
        "none": "tag, size, stride = 3, None, None",
        "tuple": "tag, size, stride = ctx",
        "dataclass": "tag, size, stride = ctx.tag, ctx.size, ctx.stride",
        "dict": "tag, size, stride = ctx['tag'], ctx['size'], ctx['stride']",
        "spec": "tag, size, stride = ctx.tag, ctx.size, ctx.stride",
    }[d.ctx]
    if d.outer == "args":
        read_ctx += "\nsize, stride = outer_size, outer_stride"
    first_t = d.tensors[0]
    if d.make == "wrapper":
        new_body = (
            f"return torch.Tensor._make_wrapper_subclass(\n"
            f"    cls, {first_t}.size() if size is None else size,\n"
            f"    strides={first_t}.stride() if stride is None else stride,\n"
            f"    storage_offset={first_t}.storage_offset(), dtype={first_t}.dtype,\n"
            f"    device={first_t}.device, requires_grad={first_t}.requires_grad)"
        )
    else:
        new_body = f"return torch.Tensor._make_subclass(cls, {first_t}, {first_t}.requires_grad)"
    init = [f"self.{a} = {a}" for a in d.attrs] + ["self.tag = tag"]
    if d.ctx == "spec":
        init.append(f"self._spec = gen.Spec({'mesh' if 'mesh' in d.attrs else 'None'}, tag)")
    lines = [f"class {n}(torch.Tensor):"]
    if d.torch_function == "disabled":
        lines.append("    __torch_function__ = torch._C._disabled_torch_function_impl")
    lines += [
        "",
        "    @staticmethod",
        f"    def __new__(cls, {params}, tag, size=None, stride=None):",
        textwrap.indent(new_body, " " * 8),
        "",
        f"    def __init__(self, {params}, tag, size=None, stride=None):",
        *("        " + x for x in init),
        "",
        "    def __tensor_flatten__(self):",
        f"        return {list(d.attrs)!r}, {ctx_expr}",
        "",
        "    @staticmethod",
        "    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):",
        textwrap.indent(read_ctx, " " * 8),
        f"        return {n}({', '.join(f'inner[{a!r}]' for a in d.attrs)}, tag, size, stride)",
        "",
    ]
    if d.repr:
        lines += [
            "    def __repr__(self):",
            f"        return f\"{n}({', '.join('{self.' + a + '!r}' for a in d.attrs)})\"",
            "",
        ]
    if d.coerce:
        lines += [
            "    def __coerce_tangent_metadata__(self):",
            f"        ts = [getattr(self, t).contiguous() for t in {list(d.tensors)!r}]",
            f"        return {n}(*[ts.pop(0) if a.startswith('t') else getattr(self, a) "
            f"for a in {list(d.attrs)!r}], self.tag)",
            "",
        ]
    tensors = ", ".join(f"self.{t}" for t in d.tensors)
    rewrap = ", ".join(
        f"ts[{d.tensors.index(a)}]" if a.startswith("t") else f"first.{a}" for a in d.attrs
    )
    member = ""
    if d.reads_members:
        member = (
            "        k = first.mesh.k  # a registered member, read while tracing too\n"
            "        if not isinstance(k, int):\n"
            "            raise TypeError(f'mesh.k is {type(k).__name__}, not int')\n"
        )
    if d.checks_type:
        for a in d.opaques:
            typ = OPAQUE_ATTRS[a][0].__name__
            member += (
                f"        if not isinstance(first.{a}, gen.{typ}):\n"
                f"            raise TypeError(f'{a} is {{type(first.{a}).__name__}}, not {typ}')\n"
            )
    # k is only read and checked, never used in values: a dispatch whose
    # ops differ in more than their inner results (say, scaling fresh outputs
    # by k) lets a view AOTAutograd regenerates differ from eager's, natively too
    scale = ""
    lines += [
        f"    def _tensors(self):",
        f"        return [{tensors}]",
        "",
        "    @classmethod",
        "    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):",
        "        kwargs = kwargs or {}",
        f"        first = next(a for a in tree_leaves((args, kwargs)) if isinstance(a, {n}))",
        member.rstrip("\n"),
        "        outs = []",
        f"        for i in range({len(d.tensors)}):",
        f"            a, kw = tree_map_only({n}, lambda t: t._tensors()[min(i, len(t._tensors()) - 1)], (args, kwargs))",
        "            out = func(*a, **kw)",
        scale.rstrip("\n"),
        "            outs.append(out)",
        "        if func._schema.is_mutable:",
        "            return args[0]",
        "        def wrap(ts):",
        f"            return {n}({rewrap}, first.tag)",
        "        if isinstance(outs[0], torch.Tensor):",
        "            return wrap(outs)",
        "        if isinstance(outs[0], (tuple, list)) and all(isinstance(o, torch.Tensor) for o in outs[0]):",
        "            return type(outs[0])(wrap([o[j] for o in outs]) for j in range(len(outs[0])))",
        "        return outs[0]",
    ]
    return "\n".join(line for line in lines if line is not None) + "\n"


_DEFINED: dict = {}


def define(d: SubclassDef) -> type:
    """The class for ``d``: its source exec'd into a module of its own,
    registered in sys.modules (pickling and Dynamo see a real class)."""
    import sys
    import types

    cls = _DEFINED.get(d)
    if cls is None:
        mod = types.ModuleType(f"tsrt_fuzz_defs_{d.name}")
        mod.__dict__.update(torch=torch, gen=sys.modules[__name__], tree_leaves=tree_leaves,
                            tree_map_only=tree_map_only)
        sys.modules[mod.__name__] = mod
        exec(compile(class_source(d), f"<{mod.__name__}>", "exec"), mod.__dict__)  # noqa: S102
        cls = _DEFINED[d] = getattr(mod, d.name)
        cls._fuzz_def = d
    return cls


@st.composite
def subclass_def(draw, outer_of_nested=False):
    n_t = draw(st.integers(1, 2))
    opaques = [a for a in OPAQUE_ATTRS if draw(st.booleans())]
    if not opaques and draw(st.integers(0, 3)) > 0:
        opaques = [draw(st.sampled_from(list(OPAQUE_ATTRS)))]
    attrs = tuple(draw(st.permutations([f"t{i}" for i in range(n_t)] + opaques)))
    attrs = _t0_first_among_tensors(attrs)  # t0 sizes the wrapper
    # _make_subclass is drawn 1 time in 5: native 2.13 refuses it (REFUSALS),
    # so such a case checks only that the refusal is the same
    make = "wrapper" if outer_of_nested else draw(st.sampled_from(["wrapper"] * 4 + ["subclass"]))
    ctx = draw(st.sampled_from(["none", "tuple", "dataclass", "dict", "spec"]))
    if ctx == "spec" and "mesh" not in attrs:
        ctx = "dataclass"
    outer = draw(st.sampled_from(["inner", "args", "ctx"]))
    if make == "subclass" or (outer == "ctx" and ctx == "none"):
        outer = "inner"
    return SubclassDef(
        attrs=attrs,
        make=make,
        repr=draw(st.booleans()),
        torch_function=draw(st.sampled_from(["disabled", "inherited"])),
        ctx=ctx,
        reads_members="mesh" in attrs and draw(st.booleans()),
        outer=outer,
        # sizes/strides in the context: a tangent laid out otherwise than
        # AOTAutograd guessed (contiguous) has other metadata, which torch
        # refuses ("guessed its metadata incorrectly"; native 2.13 too)
        # unless the class coerces its tangents, so such a class does
        coerce=outer == "ctx" or draw(st.booleans()),
        checks_type=bool(opaques) and draw(st.booleans()),
    )


def _t0_first_among_tensors(attrs):
    ts = iter(sorted(a for a in attrs if a.startswith("t")))
    return tuple(next(ts) if a.startswith("t") else a for a in attrs)


@st.composite
def gen_input_spec(draw, d: SubclassDef, nd: SubclassDef | None):
    kind = draw(st.sampled_from(["plain", "sub", "sub"] + (["nested", "nested"] if nd else [])))
    if kind == "plain":
        return InputSpec("plain", requires_grad=draw(st.booleans()), cls="gen")

    def labels(defn, taken):
        out = []
        for a in defn.opaques:
            pool = [p for p in OPAQUE_ATTRS[a][1] if p not in taken]
            lab = draw(st.sampled_from(pool))
            taken.add(lab)
            out.append(lab)
        return tuple(out)

    taken: set = set()
    spec = InputSpec(kind, cls="gen", n_tensors=len(d.tensors),
                     opaque_labels=labels(d, taken), requires_grad=draw(st.booleans()))
    if kind == "nested":
        spec.outer_labels = labels(nd, taken)
    return spec


VIEWS_OF_INPUTS = ["{x}.view(-1)", "{x}.unsqueeze(0)", "{x}[0]", "{x}.detach()"]


@st.composite
def gen_cases(draw, *, inductor_share=0.05):
    d = draw(subclass_def())
    # a wrapper around _make_subclass instances is not drawn: their eager
    # dispatch already fails (re-typing a tensor that has a Python object)
    nd = draw(subclass_def(outer_of_nested=True)) if d.make == "wrapper" and draw(st.booleans()) else None
    specs = draw(st.lists(gen_input_spec(d, nd), min_size=1, max_size=3))
    if not any(s.kind != "plain" for s in specs):
        specs[0] = draw(gen_input_spec(d, None).filter(lambda s: s.kind != "plain"))
    # sizes in the context are guarded by value: mark_dynamic on such an
    # input contradicts the definition (ConstraintViolationError natively
    # too, depending on which sizes the program reads), so it is not drawn
    # Likewise mark_dynamic on a nested input whose inner class builds its
    # wrapper from unflatten's outer_size: refused natively in a way the case
    # does not predict (Note [mark_dynamic on a nested input over an
    # args-sized class] in test_differential.py, which checks it apart)
    dynamic = (draw(st.booleans()) and all(x.outer != "ctx" for x in (d, nd) if x)
               and not (nd is not None and d.outer == "args"))
    for s in specs:
        s.dynamic = dynamic
    shape = draw(st.sampled_from([(4,), (3, 4)]))
    attrs = {"sub": d.opaques, "nested": d.opaques}
    src = draw(program(specs, shape, opaque_attrs=attrs))
    if d.outer == "ctx" or (nd is not None and nd.outer == "ctx"):
        # strides in the context: a transposed output's tangent is not
        # always coerced (see the view-of-input note below): keep outputs
        # contiguous
        src = src.replace(".t()", ".t().contiguous()")
    view_of_input = draw(st.integers(0, 2)) == 0
    if view_of_input:
        i = draw(st.integers(0, len(specs) - 1))
        # a transposed view of an input as an output of a class with its
        # strides in the context: its tangent's strides differ from the
        # guess, and AOTAutograd does not coerce the tangent of an output
        # that aliases an input ("guessed its metadata incorrectly", native
        # 2.13 too, __coerce_tangent_metadata__ or not): not drawn
        ctx_strides = d.outer == "ctx" or (nd is not None and nd.outer == "ctx")
        transposed = ["{x}.t()"] if len(shape) == 2 and not ctx_strides else []
        view = draw(st.sampled_from(VIEWS_OF_INPUTS + transposed))
        head, ret = src.rsplit("return (", 1)
        src = head + "return (" + view.format(x=f"x{i}") + ", " + ret
    used = (d,) if nd is None or not any(s.kind == "nested" for s in specs) else (d, nd)
    backend = _pick_backend(repr((used, specs, src)), inductor_share)
    return Case(specs, shape, src, backend, defs=used, view_of_input=view_of_input)


def def_features(d: SubclassDef, nested_outer: bool = False) -> list:
    """The coverage shapes one definition shows."""
    f = [
        f"make={d.make}",
        "repr" if d.repr else "no-repr",
        f"torch_function={d.torch_function}",
        f"ctx={d.ctx}",
        f"outer_size={d.outer}",
        "coerce_tangent" if d.coerce else "no-coerce_tangent",
    ]
    ops = d.opaques
    if not ops:
        f.append("opaques=none")
    else:
        first_op = min(d.attrs.index(a) for a in ops)
        last_op = max(d.attrs.index(a) for a in ops)
        if first_op == 0:
            f.append("opaque-before-tensors")
        if last_op == len(d.attrs) - 1:
            f.append("opaque-after-tensors")
        if 0 < first_op < len(d.attrs) - 1 or 0 < last_op < len(d.attrs) - 1:
            f.append("opaque-between-tensors")
    if len(set(OPAQUE_ATTRS[a][0] for a in ops)) > 1:
        f.append("several-opaque-types")
    if d.reads_members:
        f.append("dispatch-reads-member")
    if d.checks_type:
        f.append("dispatch-isinstance-opaque")
    return f


def case_features(case: Case) -> list:
    f = list(def_features(case.defs[0]))
    if len(case.defs) > 1:
        f.append("nested-different-defs")
        f += [f"nested-outer:{x}" for x in def_features(case.defs[1])]
    if case.view_of_input:
        f.append("output-view-of-input")
    f.append(f"backend={case.backend}")
    if any(s.requires_grad for s in case.inputs):
        f.append("backward")
    return f


#: what native torch 2.13 refuses among generated definitions, found by
#: running them there: (error class name, message pattern). Every mode must
#: refuse the same cases with the same class (the compiled call; eager works).
REFUSALS = {
    # Dynamo fakeifies a subclass input through __tensor_unflatten__ with
    # fake inner tensors; _make_subclass(cls, fake) cannot re-type a tensor
    # that already is a FakeTensor (torch/_dynamo, meta_utils), natively too
    "make_subclass": (
        "InternalTorchDynamoError",
        r"Creating a new Tensor subclass \w+ but the raw Tensor object is already associated "
        r"to a python object of type FakeTensor",
    ),
}


def expected_refusal(case: Case):
    """``REFUSALS`` entry for ``case``, or None when it must compile."""
    if not case.defs:
        return None
    body = case.source.split("\n", 1)[1]

    def used(kinds):
        return any(s.kind in kinds and re.search(rf"\bx{i}\b", body) for i, s in enumerate(case.inputs))

    if case.defs[0].make == "subclass" and used(("sub", "nested")):
        return REFUSALS["make_subclass"]
    return None


# --------------------------------------------------------------------------
# functional collectives over a ProcessGroup inner attr
#
# A sharded tensor written as users write one: its local data and the
# ProcessGroup it is sharded over among the inner attrs (``["a", "pg"]``),
# no ``__repr__``. The compiled function runs functional collectives on the
# local data over an input's group, as a subclass's own methods do
# (``funcol.all_reduce(x.a * 2, "sum", x.pg)``), and may return the group.
# One process: world-size-1 gloo groups (test/fixtures.py), so a collective
# leaves the values as they are; what is checked is that the function
# compiles whole (fullgraph), equals eager, runs the graph traced for the
# very groups it is given (a new group recompiles: the collective's group
# name is a constant of the graph, as natively) and returns the runtime
# group.


#: local data ``a`` and its ProcessGroup ``pg``; ops run on ``a``
PGTensor = fixtures.local_and_opaque("PGTensor", "pg")


COLLECTIVES = {
    "all_reduce": 'funcol.all_reduce({v}, "sum", {g})',
    "all_reduce_max": 'funcol.all_reduce({v}, "max", {g})',
    "all_gather_tensor": "funcol.all_gather_tensor({v}, 0, {g})",
    "reduce_scatter_tensor": 'funcol.reduce_scatter_tensor({v}, "sum", 0, {g})',
    "broadcast": "funcol.broadcast({v}, 0, {g})",
}


@dataclasses.dataclass
class CollectiveCase:
    groups: tuple              # the group label of each PGTensor input ("G", "H")
    n_plain: int               # plain tensor inputs after them
    shape: tuple
    source: str                # the module: funcol imported, def fn(x0, ...)
    collectives: tuple = ()    # names (COLLECTIVES) the program calls


@st.composite
def collective_cases(draw):
    n_sub = draw(st.integers(1, 2))
    groups = tuple(draw(st.sampled_from(["G", "H"])) for _ in range(n_sub))
    n_plain = draw(st.integers(0, 1))
    shape = draw(st.sampled_from([(4,), (2, 4)]))
    args = [f"x{i}" for i in range(n_sub + n_plain)]
    vals = [f"x{i}.a" for i in range(n_sub)] + args[n_sub:]
    lines, called = [], []
    for k in range(draw(st.integers(1, 4))):
        v, w = draw(st.sampled_from(vals)), draw(st.sampled_from(vals))
        if k == 0 or draw(st.booleans()):
            name = draw(st.sampled_from(sorted(COLLECTIVES)))
            g = f"x{draw(st.integers(0, n_sub - 1))}.pg"
            lines.append(f"v{k} = " + COLLECTIVES[name].format(v=v, g=g))
            called.append(name)
        else:
            lines.append(f"v{k} = " + draw(st.sampled_from(POINTWISE)).format(v=v, w=w))
        vals.append(f"v{k}")
    made = vals[n_sub + n_plain:]
    terms = ["{v}", "{v}.sum()", "({v} * {w}).sum()"]
    if len(shape) == 2:
        terms.append("{v} @ {w}.t()")
    outs = [draw(st.sampled_from(terms)).format(v=draw(st.sampled_from(made)), w=draw(st.sampled_from(vals)))
            for _ in range(draw(st.integers(1, 2)))]
    # every collective's result reaches an output, as in real code (an
    # eager collective whose result is never used is never waited for)
    for k, line in enumerate(lines):
        later = "\n".join(lines[k + 1:] + outs)
        if "funcol." in line and not re.search(rf"\bv{k}\b", later):
            outs.append(f"v{k}.sum()")
    if draw(st.integers(0, 2)) == 0:
        outs.append(f"x{draw(st.integers(0, n_sub - 1))}.pg")  # the group itself
    body = "\n".join(lines + [f"return ({', '.join(outs)},)"])
    source = ("import torch\nimport torch.distributed._functional_collectives as funcol\n\n\n"
              f"def fn({', '.join(args)}):\n" + textwrap.indent(body, "    ") + "\n")
    return CollectiveCase(groups, n_plain, shape, source, tuple(called))


def collective_features(case: CollectiveCase) -> list:
    f = [f"collective={c}" for c in case.collectives]
    if len(set(case.groups)) < len(case.groups):
        f.append("shared-group")
    if ".pg" in case.source.rsplit("return", 1)[1]:  # outputs name no collective
        f.append("group-output")
    return sorted(set(f))
