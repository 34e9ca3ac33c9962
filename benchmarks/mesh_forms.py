"""One wrapper subclass in the three forms a user can give it.

* ``plain``: no subclass, the local tensors themselves;
* ``context``: the mesh kept in the ``__tensor_flatten__`` context, inside a
  spec that compares by value (the mesh's name here; a DeviceMesh's ranks and
  shape in real code), as users write it today (PhysicsNeMo's ShardTensor
  returns ``inner_names, (self._spec, self.requires_grad)``). Dynamo guards
  on the context, so k meshes that compare unequal are k compiled graphs;
* ``attr``: the mesh an inner attr, a registered reference-type opaque
  (``torch_subclass_rt.examples.mesh_tensor.MeshTensor`` as it is): a graph
  input, so one graph serves every mesh.

``ContextMeshTensor`` is ``MeshTensor`` with only the flatten, unflatten and
the class its outputs are made in changed, so a difference between the two
forms is the difference between a context and an inner attr. Imports torch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from torch_subclass_rt.examples.mesh_tensor import MeshHandle, MeshTensor

FORMS = ("plain", "context", "attr")


class MeshSpec:
    """Flatten context of the ``context`` form: the mesh, compared by value."""

    __slots__ = ("mesh",)

    def __init__(self, mesh: MeshHandle) -> None:
        self.mesh = mesh

    def __eq__(self, other: object) -> bool:
        return type(other) is MeshSpec and other.mesh.name == self.mesh.name

    def __hash__(self) -> int:
        return hash(self.mesh.name)

    def __repr__(self) -> str:
        return f"MeshSpec({self.mesh.name!r})"


class ContextMeshTensor(MeshTensor):
    """``MeshTensor`` with its mesh in the flatten context."""

    def __tensor_flatten__(self):
        return ["_local"], MeshSpec(self.mesh)

    @staticmethod
    def __tensor_unflatten__(inner, spec, outer_size, outer_stride):
        return ContextMeshTensor(inner["_local"], spec.mesh, outer_size, outer_stride)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        mesh = next(a.mesh for a in pytree.tree_leaves((args, kwargs))
                    if isinstance(a, ContextMeshTensor))
        args, kwargs = pytree.tree_map_only(ContextMeshTensor, lambda t: t._local, (args, kwargs))
        out = func(*args, **kwargs)
        return pytree.tree_map_only(torch.Tensor, lambda t: ContextMeshTensor(t, mesh), out)


def meshes(k: int) -> list[MeshHandle]:
    """``k`` distinct meshes of the same shape (names differ, so their specs
    compare unequal, as two meshes over different ranks do)."""
    return [MeshHandle(f"mesh{i}") for i in range(k)]


def inputs(form: str, n: int, mesh: MeshHandle, grad: bool, device: str = "cpu",
           size: int = 8) -> list[Any]:
    """``n`` inputs of ``size`` elements on ``mesh`` in ``form``."""
    xs = []
    for _ in range(n):
        local = torch.randn(size, device=device, requires_grad=grad)
        if form == "context":
            local = ContextMeshTensor(local, mesh)
        elif form == "attr":
            local = MeshTensor(local, mesh)
        elif form != "plain":
            raise ValueError(f"form: one of {', '.join(FORMS)}, got {form!r}")
        xs.append(local)
    return xs


def mesh_of(out: Any) -> Any:
    """The mesh an output carries (None for a plain tensor)."""
    return getattr(out, "mesh", None)
