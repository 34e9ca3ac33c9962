"""A real sharded tensor over real process groups.

``ShardTensor`` is a wrapper subclass whose ``__tensor_flatten__`` returns
``["_local", "mesh"]``: the mesh is an inner attr, a reference-type opaque,
so a compiled function takes it as a graph input. One compiled graph serves
every mesh, the collectives in it run on the mesh of the *call*, and outputs
/ grads carry the caller's mesh. The flatten context holds only static
metadata: the placement (``("shard", dim)`` or ``("replicate",)``) and the
world size.

The mesh is one of:

* ``MeshHandle``, our reference opaque around a ``torch.distributed``
  process group (gloo here; any ``ProcessGroup`` works);
* a 1-D ``DeviceMesh`` itself, which torch >= 2.12 registers as a reference
  opaque, and torch 2.11 once ``install()`` ran (``device_mesh_type()`` says
  whether it is one here). Dispatch reads it at trace time (``ndim``,
  ``size()``), as a real sharded tensor does.

Communication is done by custom ops that take the mesh as an argument, one
set per kind of mesh (an op's schema names one opaque type)::

    sharded::all_reduce_sum(Tensor x, MeshHandle mesh) -> Tensor
    sharded::all_gather(Tensor x, MeshHandle mesh, int dim, int world_size) -> Tensor
    sharded::local_chunk(Tensor x, MeshHandle mesh, int dim, int world_size) -> Tensor
    sharded::*_device_mesh(...)   the same, taking a DeviceMesh

``all_reduce_sum`` / ``all_gather`` / ``local_chunk`` pick the set by the
mesh's type. Each op has a fake impl (shapes only; it never reads the mesh,
which is a ``FakeScriptObject`` while tracing) and an autograd formula,
assuming, as in data parallelism, that whatever is replicated is consumed
identically on every rank: ``all_reduce_sum``'s backward is the identity,
``all_gather``'s is ``local_chunk``, ``local_chunk``'s is ``all_gather``.

``ShardTensor.__torch_dispatch__`` knows the handful of rules an MLP trained
on a batch-sharded input needs (forward and backward): batch-local ops run on
the local shard; contractions and reductions over the sharded dim run locally
and then ``all_reduce_sum`` (their result is replicated, returned as a plain
tensor, so parameter grads are plain tensors); a replicated tensor meeting a
sharded one along the sharded dim is cut to this rank's rows with
``local_chunk``. Anything else raises ``NotImplementedError``. It is a demo,
not DTensor: static shapes, even sharding, one mesh dimension.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch
import torch.utils._pytree as pytree

from .. import _torch_compat

__all__ = [
    "MeshHandle",
    "ShardTensor",
    "all_reduce_sum",
    "all_gather",
    "local_chunk",
    "distribute",
    "device_mesh_type",
    "collective_calls",
    "inject_failure",
]

Placement = tuple  # ("shard", dim) | ("replicate",)


class MeshHandle(_torch_compat.opaque_base()):  # type: ignore[misc]
    """A reference-type opaque around one process group.

    Compared by identity: two handles over equal groups are different
    meshes, and a compiled graph is called with whichever one the inputs
    carry.
    """

    def __init__(self, group: Any, name: str = "mesh") -> None:
        self.group = group
        self.name = name

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def size(self) -> int:
        return self.group.size()

    def __repr__(self) -> str:
        return f"MeshHandle({self.name!r})"

    # A process group cannot be pickled. Pickling a handle keeps its name
    # only (torch 2.11's Inductor pickles the handles a graph was traced with
    # into its FX-graph cache key, and bypasses the cache when that fails);
    # an unpickled handle has no group and cannot run collectives.
    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(None, state["name"])

    # A reference: copies are the handle itself (a module holding one is
    # deep-copied with its mesh shared; Dynamo deep-copies flatten contexts
    # to guard on them, which must keep comparing by identity).
    def __copy__(self) -> MeshHandle:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> MeshHandle:
        return self


if not _torch_compat.is_registered_opaque_type(MeshHandle):
    _torch_compat.register_opaque(MeshHandle, typ="reference")


# --------------------------------------------------------------------------
# the kinds of mesh a ShardTensor can hold


def device_mesh_type() -> type | None:
    """``DeviceMesh`` where this torch treats it as a reference opaque, else
    ``None``: torch >= 2.12 registers it (importing ``torch.distributed.tensor``
    does), torch 2.11 once ``install()`` ran. Defines the collectives taking a
    DeviceMesh the first time it is one (an op's schema names the type, so
    they can only be defined after the registration)."""
    if not torch.distributed.is_available():
        return None
    # registers DeviceMesh on torch >= 2.12 (and with the patch series)
    importlib.import_module("torch.distributed.tensor")
    from torch.distributed.device_mesh import DeviceMesh

    if not _torch_compat.is_reference_opaque_type(DeviceMesh):
        return None
    if DeviceMesh not in _COLLECTIVES:
        _add_collectives(DeviceMesh, "_device_mesh")
    return DeviceMesh


def _is_device_mesh(mesh: Any) -> bool:
    return not isinstance(mesh, MeshHandle)


def mesh_group(mesh: Any) -> Any:
    """The process group a 1-D mesh (a MeshHandle or a DeviceMesh) runs on."""
    return mesh.get_group() if _is_device_mesh(mesh) else mesh.group


def mesh_rank(mesh: Any) -> int:
    return mesh.get_local_rank() if _is_device_mesh(mesh) else mesh.rank


def mesh_size(mesh: Any) -> int:
    return mesh.size() if _is_device_mesh(mesh) else mesh.size


def mesh_name(mesh: Any) -> str:
    return mesh.name if isinstance(mesh, MeshHandle) else repr(mesh)


# Per real mesh object (by identity: two DeviceMeshes over the same ranks
# compare equal): how many collectives ran on it, and an injected failure.
_calls: dict[int, int] = {}
_failures: dict[int, str] = {}


def collective_calls(mesh: Any) -> int:
    """Collectives run so far on this very mesh (proves which mesh a
    compiled graph used)."""
    return _calls.get(id(mesh), 0)


def inject_failure(mesh: Any, message: str | None) -> None:
    """Make the next collectives on ``mesh`` raise (``None``: stop)."""
    if message is None:
        _failures.pop(id(mesh), None)
    else:
        _failures[id(mesh)] = message


def _enter_collective(mesh: Any) -> None:
    _calls[id(mesh)] = _calls.get(id(mesh), 0) + 1
    failure = _failures.get(id(mesh))
    if failure is not None:
        raise RuntimeError(f"rank {mesh_rank(mesh)} ({mesh_name(mesh)}): {failure}")


# --------------------------------------------------------------------------
# collectives as custom ops taking the mesh as an argument, one set per kind
# of mesh (an op's schema names one opaque type):
#
# (see the module docstring). Annotating with the class works on 2.11 and
# 2.13: infer_schema maps registered opaque types to their registered name.


def _all_reduce_sum_impl(x, mesh):
    _enter_collective(mesh)
    out = x.clone(memory_format=torch.contiguous_format)
    mesh_group(mesh).allreduce([out]).wait()
    return out


def _all_reduce_sum_fake(x, mesh):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _all_gather_impl(x, mesh, dim, world_size):
    _enter_collective(mesh)
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(world_size)]
    # (world size 1: the result is parts[0] copied by cat, never x itself)
    mesh_group(mesh).allgather([parts], [x]).wait()
    return torch.cat(parts, dim)


def _all_gather_fake(x, mesh, dim, world_size):
    size = list(x.shape)
    size[dim] = size[dim] * world_size
    return x.new_empty(size)


def _local_chunk_impl(x, mesh, dim, world_size):
    # This rank's piece of a replicated tensor (no communication; the rank is
    # read off the runtime mesh, never baked into a graph).
    _enter_collective(mesh)
    return x.chunk(world_size, dim)[mesh_rank(mesh)].clone(memory_format=torch.contiguous_format)


def _local_chunk_fake(x, mesh, dim, world_size):
    size = list(x.shape)
    size[dim] = size[dim] // world_size
    return x.new_empty(size)


def _setup_mesh_ctx(ctx, inputs, output) -> None:
    ctx.mesh = inputs[1]
    ctx.extra = tuple(inputs[2:])
    # full_tensor() calls all_gather on a ShardTensor: its grad is one too
    ctx.shard_type = type(inputs[0]) if isinstance(inputs[0], ShardTensor) else None


def _all_reduce_sum_bwd(ctx, grad):
    # the reduced value is replicated and consumed the same way on every
    # rank, so every rank already holds d(loss)/d(its own input)
    return grad, None


def _all_gather_bwd(ctx, grad):
    piece = local_chunk(grad, ctx.mesh, *ctx.extra)
    if ctx.shard_type is not None:
        dim, world_size = ctx.extra
        piece = ctx.shard_type(piece, ctx.mesh, ("shard", dim), world_size)
    return piece, None, None, None


def _local_chunk_bwd(ctx, grad):
    return all_gather(grad, ctx.mesh, *ctx.extra), None, None, None


_OP_SPECS = {
    # name: (impl, fake, backward, extra int args)
    "all_reduce_sum": (_all_reduce_sum_impl, _all_reduce_sum_fake, _all_reduce_sum_bwd, ()),
    "all_gather": (_all_gather_impl, _all_gather_fake, _all_gather_bwd, ("dim", "world_size")),
    "local_chunk": (_local_chunk_impl, _local_chunk_fake, _local_chunk_bwd, ("dim", "world_size")),
}


def _define_collectives(mesh_type: type, suffix: str) -> dict[str, Any]:
    ops = {}
    for name, (impl, fake, bwd, ints) in _OP_SPECS.items():

        def op_fn(*args, _impl=impl):
            return _impl(*args)

        # the schema comes from these (real classes, not strings)
        op_fn.__signature__ = inspect.Signature(
            [
                inspect.Parameter("x", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=torch.Tensor),
                inspect.Parameter("mesh", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=mesh_type),
                *(
                    inspect.Parameter(i, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=int)
                    for i in ints
                ),
            ],
            return_annotation=torch.Tensor,
        )
        op = torch.library.custom_op(f"sharded::{name}{suffix}", mutates_args=())(op_fn)
        op.register_fake(fake)
        op.register_autograd(bwd, setup_context=_setup_mesh_ctx)
        ops[name] = op
    return ops


_COLLECTIVES: dict[type, dict[str, Any]] = {}


def _add_collectives(mesh_type: type, suffix: str) -> None:
    ops = _COLLECTIVES[mesh_type] = _define_collectives(mesh_type, suffix)
    # full_tensor(): the op itself, on the local shard
    _RULES[ops["all_gather"]._opoverload] = _all_gather_rule


_RULES: dict[Any, Any] = {}  # dispatch rules, filled in at the end


def _collectives_for(mesh: Any) -> dict[str, Any]:
    # while tracing, the mesh is a FakeScriptObject of the real one
    real_type = type(_torch_compat.unwrap_fake_opaque(mesh))
    if real_type.__name__ == "DeviceMesh":
        device_mesh_type()  # defines them where DeviceMesh is an opaque
    for cls in real_type.__mro__:
        ops = _COLLECTIVES.get(cls)
        if ops is not None:
            return ops
    raise TypeError(
        f"ShardTensor: a mesh must be a MeshHandle"
        f"{' or a DeviceMesh' if device_mesh_type() is not None else ''}, got a "
        f"{real_type.__qualname__}"
    )


def all_reduce_sum(x: torch.Tensor, mesh: Any) -> torch.Tensor:
    """Sum of ``x`` over the ranks of ``mesh`` (differentiable)."""
    return _collectives_for(mesh)["all_reduce_sum"](x, mesh)


def all_gather(x: torch.Tensor, mesh: Any, dim: int, world_size: int) -> torch.Tensor:
    """The ranks' ``x`` concatenated along ``dim`` (differentiable)."""
    return _collectives_for(mesh)["all_gather"](x, mesh, dim, world_size)


def local_chunk(x: torch.Tensor, mesh: Any, dim: int, world_size: int) -> torch.Tensor:
    """This rank's piece of a replicated ``x`` along ``dim`` (differentiable)."""
    return _collectives_for(mesh)["local_chunk"](x, mesh, dim, world_size)

# --------------------------------------------------------------------------
# the subclass


def _outer_stride(local: torch.Tensor, outer_size) -> tuple[int, ...]:
    """Dense strides for ``outer_size`` in the dim order of ``local``'s
    strides (a transposed shard gives a transposed global tensor)."""
    order = sorted(range(local.dim()), key=lambda d: (-local.stride(d), d))
    strides = [0] * local.dim()
    running = 1
    for d in reversed(order):
        strides[d] = running if local.stride(d) != 0 or local.size(d) == 1 else 0
        running *= outer_size[d]
    return tuple(strides)


class ShardTensor(torch.Tensor):
    """A global tensor of which this rank holds ``_local``.

    ``placement`` is ``("shard", dim)`` (even split of ``dim`` over
    ``world_size`` ranks) or ``("replicate",)`` (``_local`` is the whole
    tensor; ops on a replicated ShardTensor return plain tensors, as every
    replicated result here does).
    """

    _local: torch.Tensor
    mesh: Any  # MeshHandle, or DeviceMesh on torch >= 2.12
    placement: Placement
    world_size: int

    @staticmethod
    def __new__(cls, local, mesh, placement, world_size, outer_size=None, outer_stride=None):
        if outer_size is None:
            outer_size = list(local.size())
            if placement[0] == "shard":
                outer_size[placement[1]] *= world_size
        if outer_stride is None:
            outer_stride = _outer_stride(local, outer_size)
        return torch.Tensor._make_wrapper_subclass(
            cls,
            outer_size,
            strides=outer_stride,
            dtype=local.dtype,
            device=local.device,
            layout=local.layout,
            requires_grad=local.requires_grad,
        )

    def __init__(self, local, mesh, placement, world_size, outer_size=None, outer_stride=None):
        self._local = local
        self.mesh = mesh
        self.placement = tuple(placement)
        self.world_size = world_size

    def __repr__(self) -> str:
        return f"ShardTensor({self._local}, {self.mesh}, placement={self.placement})"

    def __tensor_flatten__(self):
        return ["_local", "mesh"], (self.placement, self.world_size)

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        placement, world_size = ctx
        return ShardTensor(inner["_local"], inner["mesh"], placement, world_size, outer_size, outer_stride)

    def _stable_hash_for_caching(self) -> str:
        # AOTAutograd cache key (torch >= 2.12). The mesh object is left out:
        # it is a runtime input, and which one a call brings never changes the
        # graph. Its *type* is in: the collectives traced into the graph are
        # ops of that mesh type (a MeshHandle graph and a DeviceMesh graph
        # have the same Dynamo graph, and would share a cache entry otherwise).
        mesh_type = type(_torch_compat.unwrap_fake_opaque(self.mesh))
        return repr(
            (
                type(self).__qualname__, f"{mesh_type.__module__}.{mesh_type.__qualname__}",
                self.placement, self.world_size,
                tuple(self.shape), self.stride(), str(self.dtype), str(self.device),
                self.requires_grad, tuple(self._local.shape), self._local.stride(),
            )
        )

    @property
    def shard_dim(self) -> int | None:
        return self.placement[1] if self.placement[0] == "shard" else None

    def full_tensor(self) -> torch.Tensor:
        """The whole tensor on every rank (``all_gather``; differentiable)."""
        if self.shard_dim is None:
            return _ToLocal.apply(self)
        return all_gather(self, self.mesh, self.shard_dim, self.world_size)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rule = _RULES.get(func) or _RULES.get(func.overloadpacket) or _batch_local
        return rule(func, args, kwargs)


class _ToLocal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.meta = (type(x), x.mesh, x.placement, x.world_size)
        return x._local.view_as(x._local)

    @staticmethod
    def backward(ctx, grad):
        cls, *meta = ctx.meta
        return cls(grad, *meta)


def distribute(tensor: torch.Tensor, mesh: Any, dim: int | None = 0) -> ShardTensor:
    """Shard a tensor every rank holds in full along ``dim`` (``None``:
    replicate it)."""
    world = mesh_size(mesh)
    if dim is None:
        return ShardTensor(tensor, mesh, ("replicate",), world)
    local = local_chunk(tensor, mesh, dim, world)
    return ShardTensor(local, mesh, ("shard", dim), world)


# --------------------------------------------------------------------------
# dispatch rules (arguments below are already below autograd)


class _Spec:
    """The mesh / shard dim an op sees, taken from its sharded arguments."""

    def __init__(self, args, kwargs) -> None:
        shards = [
            a
            for a in pytree.tree_leaves((args, kwargs))
            if isinstance(a, ShardTensor) and a.shard_dim is not None
        ]
        anyst = shards or [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, ShardTensor)]
        self.first = anyst[0]
        self.mesh = self.first.mesh
        self.world = self.first.world_size
        if _is_device_mesh(self.mesh):
            _check_device_mesh(self.mesh, self.world)
        self.sharded = bool(shards)
        # shard dim counted from the right, for broadcasting ops
        self.rdim = shards[0].dim() - shards[0].shard_dim if shards else None
        self.shards = shards

    def check_aligned(self, func) -> None:
        """For broadcasting ops: every shard dim lines up (from the right)."""
        for s in self.shards[1:]:
            if s.dim() - s.shard_dim != self.rdim:
                raise NotImplementedError(
                    f"ShardTensor: {func}: {s.placement} of a {s.dim()}-d tensor and "
                    f"{self.shards[0].placement} of a {self.shards[0].dim()}-d tensor do not line up"
                )

    def wrap(self, t: torch.Tensor, dim: int | None) -> torch.Tensor:
        if dim is None:
            return t
        # type(first): subclasses of ShardTensor (tests) keep their type
        return type(self.first)(t, self.mesh, ("shard", dim), self.world)


def _check_device_mesh(mesh: Any, world: int) -> None:
    """What a sharded tensor's dispatch reads off its DeviceMesh, at trace
    time too (a FakeScriptObject then: ``ndim``, ``size()`` and
    ``mesh_dim_names`` are registered ``USE_REAL`` members, read off the real
    mesh while tracing and guarded on): one mesh dimension, as wide as the
    world this tensor was sharded over."""
    if mesh.ndim != 1 or mesh.size() != world:
        names = mesh.mesh_dim_names or ()
        raise NotImplementedError(
            f"ShardTensor: a 1-D mesh of {world} ranks expected, got a {mesh.ndim}-D "
            f"mesh {tuple(names)} of {mesh.size()} ranks"
        )


def _local(a):
    return a._local if isinstance(a, ShardTensor) else a


def _localize(spec: _Spec, a, global_size: int):
    """A replicated tensor broadcast against the shard: cut its rows."""
    if isinstance(a, ShardTensor):
        return a._local
    if not isinstance(a, torch.Tensor) or a.dim() < spec.rdim:
        return a
    d = a.dim() - spec.rdim
    if a.size(d) == global_size and global_size != global_size // spec.world:
        return local_chunk(a, spec.mesh, d, spec.world)
    return a


def _batch_local(func, args, kwargs):
    """Ops that act row by row along the shard dim (pointwise, unary, *_like)."""
    spec = _Spec(args, kwargs)
    if not spec.sharded:
        out = func(*pytree.tree_map(_local, args), **pytree.tree_map(_local, kwargs))
        return out
    spec.check_aligned(func)
    s = spec.first
    global_size = s.size(s.shard_dim)
    args, kwargs = pytree.tree_map(lambda a: _localize(spec, a, global_size), (args, kwargs))
    out = func(*args, **kwargs)
    return pytree.tree_map_only(
        torch.Tensor,
        lambda t: spec.wrap(t, t.dim() - spec.rdim) if t.dim() >= spec.rdim else t,
        out,
    )


def _reduce_replicated(spec: _Spec, partial: torch.Tensor) -> torch.Tensor:
    return all_reduce_sum(partial, spec.mesh)


def _mm(func, args, kwargs):
    a, b = args[-2], args[-1]
    spec = _Spec(args, kwargs)
    da = a.shard_dim if isinstance(a, ShardTensor) else None
    db = b.shard_dim if isinstance(b, ShardTensor) else None
    rest = [_local(x) for x in args[:-2]]  # addmm's bias
    if da == 0 and db is None:
        rest = [_localize(spec, x, a.size(0)) for x in args[:-2]]
        return spec.wrap(func(*rest, a._local, _local(b), **kwargs), 0)
    if da is None and db == 1 and not rest:
        return spec.wrap(func(_local(a), b._local, **kwargs), 1)
    if da == 1 and db == 0 and not rest:
        return _reduce_replicated(spec, func(a._local, b._local, **kwargs))
    if da is None and db is None:
        return func(*rest, _local(a), _local(b), **kwargs)
    raise NotImplementedError(f"ShardTensor: {func} with shard dims {da}, {db}")


def _transpose(func, args, kwargs):
    spec = _Spec(args, kwargs)
    x = args[0]
    out = func(x._local, *args[1:], **kwargs)
    d = x.shard_dim
    if d is None:
        return out
    if func.overloadpacket is torch.ops.aten.t:
        dims = (0, 1) if x.dim() == 2 else (0, 0)
    else:
        dims = tuple(i % x.dim() for i in args[1:3])
    if d in dims:
        d = dims[1] if d == dims[0] else dims[0]
    return spec.wrap(out, d)


def _permute(func, args, kwargs):
    spec = _Spec(args, kwargs)
    x, perm = args[0], [p % args[0].dim() for p in args[1]]
    out = func(x._local, args[1], **kwargs)
    return spec.wrap(out, None if x.shard_dim is None else perm.index(x.shard_dim))


def _sum_mean(func, args, kwargs):
    spec = _Spec(args, kwargs)
    x = args[0]
    d = x.shard_dim
    name = func.overloadpacket.__name__
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if dims is None or len(dims) == 0:
        dims = list(range(x.dim()))
    dims = [i % x.dim() for i in dims]
    if d is None:
        return func(x._local, *args[1:], **kwargs)
    if d not in dims:
        out = func(x._local, *args[1:], **kwargs)
        return spec.wrap(out, d if keepdim else d - sum(i < d for i in dims))
    # reduce over the shard: local sum, then sum over ranks
    if name == "mean":
        count = 1
        for i in dims:
            count *= x.size(i)
        local_sum = torch.ops.aten.sum.dim_IntList(x._local, dims, keepdim, dtype=kwargs.get("dtype"))
        return _reduce_replicated(spec, local_sum) / count
    return _reduce_replicated(spec, func(x._local, *args[1:], **kwargs))


def _local_sizes(x: ShardTensor, size, lead: int = 0):
    """``size`` (global, maybe with a -1 / leading broadcast dims) as local."""
    size = list(size)
    d = x.shard_dim + lead
    if size[d] not in (-1, x.size(x.shard_dim)):
        raise NotImplementedError(f"ShardTensor: reshaping the shard dim to {size}")
    if size[d] != -1:
        size[d] = x._local.size(x.shard_dim)
    return size


def _view(func, args, kwargs):
    spec = _Spec(args, kwargs)
    x, size = args[0], list(args[1])
    if x.shard_dim is None:
        return func(x._local, size, **kwargs)
    d = x.shard_dim
    if size[: d + 1] != list(x.shape[: d + 1]):
        raise NotImplementedError(f"ShardTensor: view {list(x.shape)} -> {size} moves the shard dim {d}")
    return spec.wrap(func(x._local, _local_sizes(x, size), **kwargs), d)


def _expand(func, args, kwargs):
    spec = _Spec(args, kwargs)
    x, size = args[0], list(args[1])
    if x.shard_dim is None:
        return func(x._local, size, *args[2:], **kwargs)
    lead = len(size) - x.dim()
    return spec.wrap(func(x._local, _local_sizes(x, size, lead), *args[2:], **kwargs), x.shard_dim + lead)


def _all_gather_rule(func, args, kwargs):
    # full_tensor(): the op itself, on the local shard
    return func(_local(args[0]), *args[1:], **kwargs)


aten = torch.ops.aten
_RULES |= {
    aten.mm.default: _mm,
    aten.addmm.default: _mm,
    aten.t.default: _transpose,
    aten.transpose.int: _transpose,
    aten.permute.default: _permute,
    aten.sum.default: _sum_mean,
    aten.sum.dim_IntList: _sum_mean,
    aten.mean.default: _sum_mean,
    aten.mean.dim: _sum_mean,
    aten.view.default: _view,
    aten._unsafe_view.default: _view,
    aten.reshape.default: _view,
    aten.expand.default: _expand,
}

_add_collectives(MeshHandle, "")
device_mesh_type()  # its collectives too, where DeviceMesh is an opaque already
