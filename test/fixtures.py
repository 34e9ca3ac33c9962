"""What several test modules share: process groups and meshes, the 2-rank
spawner, the stock-vs-installed comparator, and the known torch bugs more
than one module records.

:mod:`harness` is the machinery (the mode under test, expected failures,
graph dumps); this module holds the objects tests are written with. It may
be imported before the mode is set (a spawned rank imports it to start):
nothing here registers an opaque or patches anything at import.
"""

from __future__ import annotations

import contextlib
import functools
import sys

import harness
import pytest

import torch
import torch.distributed as dist

import torch_subclass_rt as tsrt
from torch_subclass_rt import ranks
from torch_subclass_rt._modes import Mode

# --------------------------------------------------------------------------
# one process: a world-size-1 gloo default group (DeviceMesh needs one)


def gloo_world() -> None:
    """The default process group: gloo, rank 0 of 1, in this process."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def mesh(*names: str):
    """A CPU DeviceMesh of one rank per dimension, named ``names``."""
    from torch.distributed.device_mesh import init_device_mesh

    gloo_world()
    return init_device_mesh("cpu", (1,) * len(names), mesh_dim_names=names)


def new_group():
    """A new gloo ProcessGroup over rank 0 of the one-rank world."""
    gloo_world()
    return dist.new_group([0], backend="gloo")


# --------------------------------------------------------------------------
# a wrapper subclass with one opaque inner attr, as users write one


def local_and_opaque(name: str, attr: str = "handle") -> type:
    """A wrapper subclass ``name`` written as users write one: its local data
    ``a`` and one opaque (a handle, a ProcessGroup, ...) as the inner attr
    ``attr``, ``__tensor_flatten__`` ``["a", attr], None``, no ``__repr__``;
    ops run on ``a`` and their outputs carry the first input's opaque. One
    definition for the tests that need only that (each test module makes
    its own class: a name of its own in messages and graphs)."""

    def __new__(cls, a, opaque):
        return torch.Tensor._make_wrapper_subclass(
            cls, a.shape, strides=a.stride(), dtype=a.dtype, device=a.device,
            requires_grad=a.requires_grad,
        )

    def __init__(self, a, opaque):
        self.a = a
        setattr(self, attr, opaque)

    def __tensor_flatten__(self):
        return ["a", attr], None

    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return cls(inner["a"], inner[attr])

    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_leaves, tree_map_only

        opaque = next(getattr(x, attr) for x in tree_leaves((args, kwargs)) if isinstance(x, cls))
        args, kwargs = tree_map_only(cls, lambda t: t.a, (args, kwargs or {}))
        return tree_map_only(torch.Tensor, lambda t: cls(t, opaque), func(*args, **kwargs))

    cls = type(name, (torch.Tensor,), {
        "__new__": staticmethod(__new__),
        "__init__": __init__,
        "__tensor_flatten__": __tensor_flatten__,
        "__tensor_unflatten__": staticmethod(__tensor_unflatten__),
        "__torch_dispatch__": classmethod(__torch_dispatch__),
        "__module__": sys._getframe(1).f_globals.get("__name__", __name__),
    })
    return cls


# --------------------------------------------------------------------------
# nested subclasses (test_opaque_attr_tracing, the codegen tests)


class Scaled(torch.Tensor):
    """An outer subclass around a MeshTensor; its scale is flatten context."""

    @staticmethod
    def __new__(cls, inner, scale):
        return torch.Tensor._make_wrapper_subclass(
            cls, inner.size(), strides=inner.stride(), dtype=inner.dtype,
            device=inner.device, requires_grad=inner.requires_grad,
        )

    def __init__(self, inner, scale):
        self.inner = inner
        self.scale = scale

    def __repr__(self):
        return f"Scaled({self.inner!r}, {self.scale})"

    def __tensor_flatten__(self):
        return ["inner"], (self.scale,)

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return Scaled(inner["inner"], ctx[0])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        scale = next(a.scale for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, Scaled))
        args, kwargs = torch.utils._pytree.tree_map_only(Scaled, lambda t: t.inner, (args, kwargs))
        out = func(*args, **kwargs)
        return torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: Scaled(t, scale), out)


# --------------------------------------------------------------------------
# value opaques in a subclass's flatten context (the upstream-fix tests:
# test_value_opaque_outputs, test_callable_value_opaque,
# test_export_opaque_constants). Defined here, registered by
# register_context_opaques() from the test module (not at import: see above).


class QuantConfig(tsrt.OpaqueBase):
    """A value-type opaque (compared by ``__eq__``): subclass metadata."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __eq__(self, other: object) -> bool:
        return isinstance(other, QuantConfig) and other.tag == self.tag

    def __hash__(self) -> int:
        return hash(self.tag)

    def __repr__(self):  # torch 2.10 prints value-type opaques with repr()
        return self.__fx_repr__()[0]

    def __fx_repr__(self):
        return f"QuantConfig({self.tag!r})", {"QuantConfig": QuantConfig}


class Quantizer(tsrt.OpaqueBase):
    """A value-type opaque that is also callable, like a quantizer."""

    def __init__(self, num_buffers: int) -> None:
        self.num_buffers = num_buffers

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def get_num_buffers(self) -> int:
        return self.num_buffers

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantizer) and other.num_buffers == self.num_buffers

    def __hash__(self) -> int:
        return hash(self.num_buffers)

    def __repr__(self):  # torch 2.10 prints value-type opaques with repr()
        return self.__fx_repr__()[0]

    def __fx_repr__(self):
        return f"Quantizer({self.num_buffers})", {"Quantizer": Quantizer}


class Handle(tsrt.OpaqueBase):
    """A reference-type opaque (compared by identity), as export inputs or
    constants."""

    def __init__(self, n: int) -> None:
        self.n = n


@functools.cache
def register_context_opaques() -> None:
    """Register QuantConfig, Quantizer and Handle (once per process).
    Members are declared: torch 2.11 only lets Dynamo read members of a value
    opaque that are registered (2.12 reads any)."""
    tsrt.register_opaque(QuantConfig, typ="value", **harness.member_kwargs(tag="USE_REAL"))
    tsrt.register_opaque(Quantizer, typ="value", **harness.member_kwargs(get_num_buffers="USE_REAL"))
    tsrt.register_opaque(Handle, typ="reference")


class MetaTensor(torch.Tensor):
    """A wrapper subclass whose flatten *context* holds a value opaque."""

    @staticmethod
    def __new__(cls, data, meta):
        return torch.Tensor._make_wrapper_subclass(
            cls, data.shape, dtype=data.dtype, device=data.device
        )

    def __init__(self, data, meta):
        self._data = data
        self._meta = meta

    def __repr__(self):
        # the default repr reads values, which a fake tensor in a log line cannot
        return f"MetaTensor({self._data!r}, {type(self._meta).__name__})"

    def __tensor_flatten__(self):
        return ["_data"], {"meta": self._meta}

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return MetaTensor(inner["_data"], ctx["meta"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = torch.utils._pytree.tree_leaves(args)
        meta = next(a._meta for a in leaves if isinstance(a, MetaTensor))
        args, kwargs = torch.utils._pytree.tree_map_only(MetaTensor, lambda t: t._data, (args, kwargs))
        out = func(*args, **kwargs)
        return torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: MetaTensor(t, meta), out)


def runtime_metas(args):
    """Metadata as AOTAutograd holds it at run time: built from fake
    tensors (as at trace time), then made runtime-safe."""
    # torch's own function: with install() it builds the metadata through
    # our create_subclass_metadata (its module global), natively with torch's
    from torch._functorch._aot_autograd.subclass_utils import create_subclass_meta
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    metas = create_subclass_meta(fake, count_symints=True)
    for m in metas:
        if hasattr(m, "make_runtime_safe"):
            m.make_runtime_safe()
    return metas


# --------------------------------------------------------------------------
# a sharded tensor holding its mesh


def real(obj):
    """The real object of a FakeScriptObject (what an opaque is while
    AOTAutograd traces), else ``obj``."""
    from torch._library.fake_class_registry import FakeScriptObject

    return obj.real_obj if isinstance(obj, FakeScriptObject) else obj


class MeshSharded(torch.Tensor):
    """A sharded tensor as PhysicsNeMo's ShardTensor holds one: the local
    shard ``_local`` and its ``mesh`` (a DeviceMesh, a submesh, a
    ProcessGroup, a user's opaque) are inner attrs, and dispatch reads the
    mesh as a sharded tensor does (a subclass's :meth:`read_mesh`, which
    records what it read in the subclass's ``seen``, per call, trace or
    eager). Ops run on the shard; tensor outputs carry the input's mesh.

    A subclass sets ``seen`` (a list of its own), :meth:`read_mesh`, and
    ``__tensor_unflatten__`` building itself."""

    seen: list

    @staticmethod
    def __new__(cls, local, mesh):
        return torch.Tensor._make_wrapper_subclass(
            cls, local.shape, strides=local.stride(), dtype=local.dtype,
            device=local.device, requires_grad=local.requires_grad,
        )

    def __init__(self, local, mesh):
        self._local = local
        self.mesh = mesh

    def __repr__(self):
        return f"{type(self).__name__}({self._local!r})"

    def __tensor_flatten__(self):
        return ["_local", "mesh"], None

    @classmethod
    def read_mesh(cls, mesh) -> None:
        raise NotImplementedError(f"{cls.__name__}.read_mesh: what dispatch reads off the mesh")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        import torch.utils._pytree as pytree

        kwargs = kwargs or {}
        mesh = next(a.mesh for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, cls))
        cls.read_mesh(mesh)
        args, kwargs = pytree.tree_map_only(cls, lambda t: t._local, (args, kwargs))
        out = func(*args, **kwargs)
        return pytree.tree_map_only(torch.Tensor, lambda t: cls(t, mesh), out)


def mesh_recording_op(name: str):
    """``(op, recorded)``: a custom op ``name`` taking ``(x, mesh)`` (a
    DeviceMesh, an opaque) and returning ``x.clone()``, and the list of the
    meshes it ran with (by identity): what the compiled graph handed a
    collective. Define it at a test module's import, after install()."""
    from torch.distributed.device_mesh import DeviceMesh

    recorded: list = []

    def record(x, mesh):
        recorded.append(mesh)
        return x.clone()

    # not string annotations (this module's __future__ import): the schema
    # is read off real types
    record.__annotations__ = {"x": torch.Tensor, "mesh": DeviceMesh, "return": torch.Tensor}
    op = torch.library.custom_op(name, record, mutates_args=())
    op.register_fake(lambda x, mesh: torch.empty_like(x))
    return op, recorded


# --------------------------------------------------------------------------
# the structured-trace log


@contextlib.contextmanager
def structured_trace_unheard(when: bool = True):
    """Inside, no handler on torch's structured-trace log (the one
    ``tlparse`` reads), as in a user's process without ``TORCH_TRACE``;
    the handlers come back after. pytest's log capture and Dynamo's
    ``TestCase`` attach one, and through it every release through 2.13
    formats AOTAutograd's metadata, which for a subclass without a
    ``__repr__`` reads its fake data and fails (issue 152183's other half,
    pinned by test/points/test_no_subclass_data_repr.py). ``when`` false:
    the handlers stay (a mode that carries that fix can be checked with
    them)."""
    from torch._logging._internal import trace_log

    held = list(trace_log.handlers) if when else []
    for h in held:
        trace_log.removeHandler(h)
    try:
        yield
    finally:
        for h in held:
            trace_log.addHandler(h)


# --------------------------------------------------------------------------
# known torch bugs that more than one module records

#: torch 2.12 registers ProcessGroup as an opaque, but its
#: ``isinstance(x, OpaqueBase)`` is nominal, so AOTAutograd's metadata check
#: refuses a ProcessGroup among inner attrs; 2.13 asks the registry, and
#: install() carries that to 2.12 (points/registered_opaque_instancecheck.py). Recorded in one process
#: (test_device_mesh_opaque.py) and over two ranks
#: (test_distributed_opaque_ranks.py).
PROCESS_GROUP_BUG_FIX = "PR 180530"
PROCESS_GROUP_BUG_RELEASES = ("2.12.0", "2.12.1")
PROCESS_GROUP_BUG_MESSAGE = r"expected Tensor or OpaqueBase, got <class '[\w.]*ProcessGroup'>"


def process_group_bug(match: str = PROCESS_GROUP_BUG_MESSAGE):
    """:func:`harness.upstream_bug` for a test that puts a ProcessGroup
    among a subclass's inner attrs (``match``: the error it fails with
    where the bug is, AOTAutograd's by default)."""
    return harness.upstream_bug(
        PROCESS_GROUP_BUG_FIX, broken_on=PROCESS_GROUP_BUG_RELEASES, fails_with=(AssertionError,),
        match=match,
    )


def process_group_bug_expected() -> bool:
    """Whether this torch and mode have that bug (nothing carries the fix)."""
    return (
        harness._torch_compat.torch_version() in PROCESS_GROUP_BUG_RELEASES
        and harness.current_mode() == Mode.NATIVE
    )


# --------------------------------------------------------------------------
# stock torch and install() in one process


def stock_and_installed(observe):
    """``(observe() on stock torch, observe() with install())``: install()
    is taken out for the first call and put back in the mode under test
    (:func:`harness.restore_mode`) whatever happens. Dynamo's caches are
    reset before each call, so neither reads the other's compiles."""
    import torch_subclass_rt as tsrt

    def run():
        torch._dynamo.reset()
        return observe()

    tsrt.uninstall()
    assert tsrt.status().mode == Mode.OFF, tsrt.status()
    try:
        stock = run()
        st = tsrt.install(force=harness.current_mode() == Mode.FORCED)
        assert st.mode == harness.current_mode(), st
        installed = run()
    finally:
        harness.restore_mode()
    return stock, installed


# --------------------------------------------------------------------------
# spawned gloo ranks


def run_ranks(fn, *args, world: int = 2, timeout: float, cache_dir: str | None = None) -> list:
    """``fn(rank, *args)`` in ``world`` spawned processes joined in one gloo
    group (torch_subclass_rt.ranks.run, with the mode under test set in
    each rank before ``fn``'s module is imported); the ranks' results, by
    rank. ``fn`` is a module-level function of a test module. A rank that
    raises, dies without reporting, or a run past ``timeout`` seconds fails
    the test with the rank's traceback; no rank is left running.
    ``cache_dir``: the Inductor cache directory of every rank (one for all,
    as the default per-user one is on a host)."""
    env = {} if cache_dir is None else {"TORCHINDUCTOR_CACHE_DIR": cache_dir}
    try:
        return ranks.run(fn, *args, world=world, timeout=timeout, env=env, setup=harness.setup_mode)
    except ranks.RankFailure as e:
        pytest.fail(str(e), pytrace=False)

