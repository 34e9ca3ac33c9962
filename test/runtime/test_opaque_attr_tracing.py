"""Beyond the upstream cases: the shapes of use the porting map marks R+
(dynamic shapes, reading ``y.mesh`` off an intermediate, view inputs,
``mark_dynamic``, nested subclasses), each checked for the runtime mesh, no
recompile on a new mesh, and the graphs it traces (test/expected/)."""

from __future__ import annotations

import harness
from fixtures import Scaled

import torch
from torch._dynamo.test_case import TestCase
from torch._dynamo.testing import AotEagerAndRecordGraphs, CompileCounterWithBackend

from torch_subclass_rt.examples.mesh_tensor import MeshHandle, MeshTensor

MODE = harness.current_mode()

harness.register_type_name_normalization(MeshHandle)
harness.register_type_name_normalization(MeshTensor)


harness.register_type_name_normalization(Scaled)


class TestOpaqueAttrTracing(TestCase):
    def compile(self, fn, **kwargs):
        self.recorder = AotEagerAndRecordGraphs()
        self.counter = CompileCounterWithBackend(self.recorder)
        return torch.compile(fn, backend=self.counter, fullgraph=True, **kwargs)

    def mesh_tensor(self, device, *shape, mesh=None, requires_grad=False):
        local = torch.randn(*shape, device=device)
        return MeshTensor(local, mesh or MeshHandle()).requires_grad_(requires_grad)

    def test_dynamic_shapes_two_dim(self, device):
        # Symbolic sizes and strides follow the opaque in the flat args; 2.11
        # read the strides from the sizes' offset when rebuilding outputs.
        f = self.compile(lambda x: (x * 2).t(), dynamic=True)
        for shape in ((3, 5), (4, 7)):
            m = MeshHandle()
            x = self.mesh_tensor(device, *shape, mesh=m, requires_grad=True)
            out = f(x)
            self.assertIs(out.mesh, m)
            self.assertEqual(out.shape, (shape[1], shape[0]))
            self.assertEqual(out.stride(), (1, shape[1]))
            self.assertEqual(out._local, (x._local * 2).t())
            out.sum().backward()
            self.assertIs(x.grad.mesh, m)
            self.assertEqual(x.grad._local, torch.full(shape, 2.0, device=device))
        self.assertEqual(self.counter.frame_count, 1)
        harness.assertExpectedGraphs(self, self.recorder)

    def test_return_intermediate_mesh(self, device):
        def f(x):
            y = x.sin()
            return y, y.mesh

        f = self.compile(f)
        for _ in range(2):
            m = MeshHandle()
            y, mesh = f(self.mesh_tensor(device, 4, mesh=m))
            self.assertIs(mesh, m)
            self.assertIs(y.mesh, m)
        self.assertEqual(self.counter.frame_count, 1)
        harness.assertExpectedGraphs(self, self.recorder)

    def test_view_input(self, device):
        f = self.compile(lambda x: x.cos() + 1)
        for _ in range(2):
            m = MeshHandle()
            base = self.mesh_tensor(device, 5, mesh=m)
            out = f(base[1:])
            self.assertIs(out.mesh, m)
            self.assertEqual(out._local, base._local[1:].cos() + 1)
        self.assertEqual(self.counter.frame_count, 1)
        harness.assertExpectedGraphs(self, self.recorder)

    def test_mark_dynamic(self, device):
        f = self.compile(lambda x: x * x)
        for n in (4, 6):
            m = MeshHandle()
            x = self.mesh_tensor(device, n, 3, mesh=m)
            torch._dynamo.mark_dynamic(x, 0)
            out = f(x)
            self.assertIs(out.mesh, m)
            self.assertEqual(out._local, x._local * x._local)
        self.assertEqual(self.counter.frame_count, 1)
        harness.assertExpectedGraphs(self, self.recorder)

    def test_nested_subclass_backward(self, device):
        f = self.compile(lambda x: x.exp() * 3)
        for _ in range(2):
            m = MeshHandle()
            x = Scaled(self.mesh_tensor(device, 4, mesh=m), 0.5).requires_grad_(True)
            out = f(x)
            self.assertIs(out.inner.mesh, m)
            self.assertEqual(out.scale, 0.5)
            out.sum().backward()
            self.assertIs(x.grad.inner.mesh, m)
            self.assertEqual(x.grad.inner._local, x.inner._local.exp() * 3)
        self.assertEqual(self.counter.frame_count, 1)
        harness.assertExpectedGraphs(self, self.recorder)


harness.instantiate_cpu_and_cuda(TestOpaqueAttrTracing, globals())

if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
