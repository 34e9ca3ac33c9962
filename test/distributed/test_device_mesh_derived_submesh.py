"""A submesh *derived* inside the traced code from a mesh input.

torch 2.13 registers DeviceMesh with a ``reconstruct_fn``: when make_fx
meets a DeviceMesh it does not track (a submesh the traced code derived,
``mesh["tp"]``, from a mesh that is a graph input), its PythonKeyTracer
emits ``device_mesh::_get_submesh(root, dims)`` on the tracked root instead
of baking the compile-time submesh into the graph. So each call's
collectives run on a submesh of that call's mesh.

torch 2.11 has none of it; ``install()`` adds it (points/_derived_submesh.py).
Without it, 2.11 fails or goes wrong in two ways, one per test below:

* derived in ``__torch_dispatch__`` (the mesh is a FakeScriptObject):
  ``TypeError: 'FakeScriptObject' object is not subscriptable``;
* derived in the compiled function (``x.mesh["tp"]``, under Dynamo): it
  compiles, but the submesh AOTAutograd meets is a constant of the graph,
  so a later call with another (equal) root mesh runs its op on a submesh
  of the *first* call's root.

A submesh that is itself the inner attr works like any mesh
(test_device_mesh_opaque.py, test_distributed_opaque_ranks.py).
"""

from __future__ import annotations

import unittest

import fixtures
import harness
import pytest

import torch
import torch.utils._pytree as pytree
from torch._dynamo.test_case import TestCase
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.testing import CompileCounterWithBackend

import torch.distributed.tensor  # noqa: F401
from torch.distributed.device_mesh import DeviceMesh

MODE = harness.current_mode()
if not harness.HAS_OPAQUE_MEMBERS:
    raise unittest.SkipTest(
        "DeviceMesh / ProcessGroup as opaque inner attrs build on opaque members (torch >= 2.11, "
        "or install() on torch 2.10); torch " + harness._torch_compat.torch_version() + " has none here"
    )

record, _recorded = fixtures.mesh_recording_op("derived_submesh::record")


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

    def __repr__(self):
        # torch's Tensor.__repr__ would dispatch ops (and derive submeshes)
        # on the fake tensors that AOTAutograd's logs print
        return f"Rooted({self._local!r}, {self.mesh!r})"

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

    def _check(self, fn, x_grad=False):
        graphs = []

        def fw_compiler(gm, _inputs):
            graphs.append(gm.code)
            return gm

        backend = aot_autograd(fw_compiler=fw_compiler, bw_compiler=lambda gm, _i: gm)
        counter = CompileCounterWithBackend(backend)
        f = torch.compile(fn, backend=counter, fullgraph=True)
        for _ in range(2):
            root = fixtures.mesh("dp", "tp")
            _recorded.clear()
            x = Rooted(torch.ones(3), root)
            if x_grad:
                x.requires_grad_()
            out = f(x)
            if x_grad:
                first = out[0] if isinstance(out, tuple) else out
                first.sum().backward()
                self.assertIsInstance(x.grad, Rooted)
                self.assertIs(x.grad.mesh, root)
                self.assertEqual(x.grad._local, torch.full((3,), 2.0))
            # forward (and, in dispatch, backward) ops ran on a submesh of
            # this call's root, not of the compile-time one
            self.assertGreaterEqual(len(_recorded), 1)
            for sub in _recorded:
                self.assertEqual(sub.mesh_dim_names, ("tp",))
                self.assertIs(sub._get_root_mesh(), root)
        self.assertEqual(counter.frame_count, 1)
        # derived from the mesh input (dims [1] of ("dp", "tp")), no constant
        code = graphs[0]
        self.assertIn("torch.ops.device_mesh._get_submesh(", code)
        self.assertIn(", [1])", code)
        self.assertNotIn("get_attr", code)
        self.assertNotIn("_torchbind_obj", code)

    def test_submesh_derived_in_dispatch(self):
        Rooted.derive = True
        self._check(lambda x: x * 2)

    def test_submesh_derived_in_dynamo(self):
        self._check(lambda x: record(x._local * 2, x.mesh["tp"]))

    def test_submesh_derived_in_dispatch_backward(self):
        Rooted.derive = True
        self._check(lambda x: x * 2, x_grad=True)

    def test_submesh_derived_in_dynamo_backward(self):
        # record has no autograd formula: it sees a detached copy
        self._check(lambda x: (x * 2, record(x._local.detach(), x.mesh["tp"])), x_grad=True)


@unittest.skipUnless(MODE == "backport", "the derived-submesh points are backport points")
class TestReconstructFnLookup(TestCase):
    """The tracer asks for the reconstruction of every argument's class;
    the lookup is cached per class and must still answer for a class that
    cannot be a cache key."""

    def test_mesh_classes_have_one_and_others_none(self):
        from torch_subclass_rt.points import derived_submesh

        class SubMesh(DeviceMesh):
            pass

        self.assertIsNotNone(derived_submesh.reconstruct_fn(DeviceMesh))
        self.assertIsNotNone(derived_submesh.reconstruct_fn(SubMesh))
        for cls in (int, torch.Tensor, torch.fx.Node, type(None)):
            self.assertIsNone(derived_submesh.reconstruct_fn(cls))

    def test_unhashable_class(self):
        from torch_subclass_rt.points import derived_submesh

        class Meta(type):
            __hash__ = None

            def __eq__(cls, other):
                return cls is other

        class Odd(metaclass=Meta):
            pass

        with self.assertRaises(TypeError):
            hash(Odd)
        self.assertIsNone(derived_submesh.reconstruct_fn(Odd))


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
