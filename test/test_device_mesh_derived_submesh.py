"""A submesh *derived* inside the traced code from a mesh input (issue 13).

torch 2.13 registers DeviceMesh with a ``reconstruct_fn``: when make_fx
meets a DeviceMesh it does not track (a submesh the traced code derived,
``mesh["tp"]``, from a mesh that is a graph input), its PythonKeyTracer
(``_try_reconstruct_opaque``) emits ``device_mesh::_get_submesh(root, dims)``
on the tracked root instead of baking the compile-time submesh into the
graph. So each call's collectives run on a submesh of that call's mesh.

Not on torch 2.11 (backport or series): 2.11 has none of it (no
``reconstruct_fn`` field in ``_OpaqueTypeInfo``, no hook in the proxy
tracer's ``create_arg``, no ``_get_submesh`` op returning a DeviceMesh,
no ``FakeScriptObject.__getitem__``). What happens there, recorded by the
two tests below (strict xfail on 2.11, pass on 2.13 native and forced):

* derived in ``__torch_dispatch__`` (the mesh is a FakeScriptObject):
  ``TypeError: 'FakeScriptObject' object is not subscriptable``;
* derived in the compiled function (``x.mesh["tp"]``, under Dynamo): it
  compiles, but Dynamo runs ``DeviceMesh.__getitem__`` at trace time and
  keeps the resulting submesh as a constant, so a later call with another
  (equal) root mesh runs its op on a submesh of the *first* call's root.

A submesh that is itself the inner attr works (test_device_mesh_opaque.py,
test_distributed_opaque_ranks.py).
"""

from __future__ import annotations

import harness
import pytest

MODE = harness.setup_mode()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402
from torch._dynamo.test_case import TestCase  # noqa: E402
from torch._dynamo.exc import BackendCompilerFailed  # noqa: E402
from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

import torch.distributed.tensor  # noqa: E402,F401
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh  # noqa: E402

_NOT_ON_211 = harness.torch_major_minor() < (2, 12)

_recorded: list = []


@torch.library.custom_op("derived_submesh::record", mutates_args=())
def record(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    _recorded.append(mesh)
    return x.clone()


@record.register_fake
def _(x, mesh):
    return torch.empty_like(x)


def _root() -> DeviceMesh:
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))


class Rooted(torch.Tensor):
    """Holds a 2-D root mesh as an inner attr; ``derive`` makes dispatch
    hand the op a submesh of it."""

    derive = False

    @staticmethod
    def __new__(cls, local, mesh):
        return torch.Tensor._make_wrapper_subclass(cls, local.shape, dtype=local.dtype, device=local.device)

    def __init__(self, local, mesh):
        self._local = local
        self.mesh = mesh

    def __tensor_flatten__(self):
        return ["_local", "mesh"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return Rooted(inner["_local"], inner["mesh"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        mesh = next(a.mesh for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, Rooted))
        args, kwargs = pytree.tree_map_only(Rooted, lambda t: t._local, (args, kwargs))
        out = func(*args, **kwargs)
        if cls.derive and func is torch.ops.aten.mul.Tensor:
            try:
                sub = mesh["tp"]
            except TypeError as e:
                # a TypeError out of dispatch reads as "unsupported operand"
                raise RuntimeError(f"deriving a submesh: {e}") from e
            out = record(out, sub)
        return pytree.tree_map_only(torch.Tensor, lambda t: Rooted(t, mesh), out)


class TestDerivedSubmesh(TestCase):
    def setUp(self):
        super().setUp()
        harness.setup_mode()
        Rooted.derive = False

    def tearDown(self):
        Rooted.derive = False
        super().tearDown()

    def _check(self, fn):
        counter = CompileCounterWithBackend("aot_eager")
        f = torch.compile(fn, backend=counter, fullgraph=True)
        for _ in range(2):
            root = _root()
            _recorded.clear()
            f(Rooted(torch.ones(3), root))
            self.assertEqual(len(_recorded), 1)
            sub = _recorded[0]
            self.assertEqual(sub.mesh_dim_names, ("tp",))
            # a submesh of this call's root, not of the compile-time one
            self.assertIs(sub._get_root_mesh(), root)
        self.assertEqual(counter.frame_count, 1)

    @pytest.mark.xfail(
        _NOT_ON_211, strict=True, raises=BackendCompilerFailed,
        reason="torch 2.11 has no reconstruct_fn: TypeError: 'FakeScriptObject' object is not subscriptable",
    )
    def test_submesh_derived_in_dispatch(self):
        Rooted.derive = True
        # torch 2.13: the structured trace log of AOTAutograd's metadata
        # (logged when a handler listens, as pytest's capture does) prints
        # a tensor holding the submesh coordinate, an unbacked SymInt, and
        # fails with GuardOnDataDependentSymNode; it is only a log record
        from unittest import mock

        import torch._functorch._aot_autograd.graph_capture as graph_capture

        try:
            with mock.patch.object(graph_capture, "trace_structured", lambda *a, **k: None):
                self._check(lambda x: x * 2)
        except BackendCompilerFailed as e:
            self.assertIn("'FakeScriptObject' object is not subscriptable", str(e))
            raise

    @pytest.mark.xfail(
        _NOT_ON_211, strict=True, raises=AssertionError,
        reason="torch 2.11 has no reconstruct_fn: Dynamo keeps the compile-time submesh as a constant",
    )
    def test_submesh_derived_in_dynamo(self):
        self._check(lambda x: record(x._local * 2, x.mesh["tp"]))


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
