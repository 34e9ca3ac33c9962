"""The smallest useful subclass with an opaque attr.

``MeshTensor`` wraps a local tensor and a ``MeshHandle`` (a reference-type
opaque standing in for a device mesh / process group). The handle is an
*inner attr* of ``__tensor_flatten__``, not flatten context, so a compiled
function takes it as a graph input: one compiled graph serves every handle,
and outputs carry the caller's handle, not the one seen at compile time.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from .. import _torch_compat


class MeshHandle(_torch_compat.opaque_base()):  # type: ignore[misc]
    """Identity-compared handle; ``name`` is for printing only."""

    def __init__(self, name: str = "mesh") -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"MeshHandle({self.name!r})"


if not _torch_compat.is_registered_opaque_type(MeshHandle):
    _torch_compat.register_opaque(MeshHandle, typ="reference")


class MeshTensor(torch.Tensor):
    """A local tensor plus the mesh it lives on."""

    @staticmethod
    def __new__(cls, local: torch.Tensor, mesh: MeshHandle, outer_size=None, outer_stride=None):
        return torch.Tensor._make_wrapper_subclass(
            cls,
            outer_size if outer_size is not None else local.size(),
            strides=outer_stride if outer_stride is not None else local.stride(),
            dtype=local.dtype,
            device=local.device,
            layout=local.layout,
            requires_grad=local.requires_grad,
        )

    def __init__(self, local, mesh, outer_size=None, outer_stride=None) -> None:
        self._local = local
        self.mesh = mesh

    def __repr__(self) -> str:
        return f"MeshTensor({self._local}, {self.mesh})"

    def __tensor_flatten__(self):
        return ["_local", "mesh"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return MeshTensor(inner["_local"], inner["mesh"], outer_size, outer_stride)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        mesh = next(
            a.mesh for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, MeshTensor)
        )
        args, kwargs = pytree.tree_map_only(MeshTensor, lambda t: t._local, (args, kwargs))
        out = func(*args, **kwargs)
        return pytree.tree_map_only(torch.Tensor, lambda t: MeshTensor(t, mesh), out)
