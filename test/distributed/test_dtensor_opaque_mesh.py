"""DTensor with its ``device_mesh`` as an opaque inner attr.

torch 2.13's DTensor flattens to ``["_local_tensor", "device_mesh"]``: the
mesh is a graph input, so one compiled graph serves equal meshes and outputs
and grads carry the caller's mesh. On torch 2.11 ``install(dtensor=True)``
gives DTensor that flatten (points/_dtensor.py); plain ``install()`` leaves
it alone. Checked: a DTensor input forward + backward with aot_eager and
inductor, one compile for two equal meshes (outputs / grads on the caller's
mesh), a recompile for other dim names, and what install() does to
DTensor's flatten with and without ``dtensor=True``.

One process, a world-size-1 gloo default group. Runs in the mode named by
TSRT_MODE (harness.py); ``dtensor=True`` changes nothing on torch >= 2.13
(native or forced), which flattens DTensor this way itself, nor with the
patch series (``patched``), which does so unconditionally (0014).
"""

from __future__ import annotations

import unittest

import fixtures
import harness

import torch
from torch._dynamo.test_case import TestCase
from torch._dynamo.testing import AotEagerAndRecordGraphs, CompileCounterWithBackend

import torch_subclass_rt as tsrt

import torch.distributed.tensor  # noqa: F401
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

MODE = harness.current_mode()
if harness.torch_major_minor() < (2, 11):
    raise unittest.SkipTest(
        "DTensor's mesh as an inner attr (install(dtensor=True)) is backported to torch 2.11 "
        "only; torch " + harness._torch_compat.torch_version() + " refuses dtensor=True "
        "(test_install.py)"
    )


def _install_dtensor() -> None:
    if MODE in ("backport", "forced"):
        st = tsrt.install(force=(MODE == "forced"), dtensor=True)
        assert st.mode == MODE, st


def _dtensor_group_points() -> set[str]:
    from torch_subclass_rt.points import all_points

    return {p.name for p in all_points() if p.group == "dtensor"}


class TestDTensorOpaqueMesh(TestCase):
    def setUp(self):
        super().setUp()
        # Known problem, torch 2.13 native as much as install(dtensor=True):
        # DTensor's sharding-propagation caches (Python and C++ fast path)
        # key on specs whose mesh is the trace's FakeScriptObject, which
        # hashes and compares as its real mesh; a later trace hits those
        # entries and gets the *earlier* trace's fake mesh back, and
        # inductor's partitioner fails with "Node tangents_2 was invalid,
        # but is output". Each test starts from empty caches.
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache

        _clear_sharding_prop_cache()
        harness.setup_mode()
        _install_dtensor()

    def tearDown(self):
        # back to the module's mode without the dtensor group
        harness.restore_mode()
        super().tearDown()

    def compile(self, fn, backend="aot_eager"):
        self.recorder = AotEagerAndRecordGraphs() if backend == "aot_eager" else None
        self.counter = CompileCounterWithBackend(self.recorder or backend)
        return torch.compile(fn, backend=self.counter, fullgraph=True)

    def _run(self, f, device, mesh):
        full = torch.randn(4, 4, device=device)
        x = distribute_tensor(full.clone().requires_grad_(True), mesh, [Shard(0)])
        out = f(x)
        self.assertIs(type(out), DTensor)
        # the caller's mesh, not the one the graph was traced with
        self.assertIs(out.device_mesh, mesh)
        self.assertEqual(out.placements, (Replicate(),))
        self.assertEqual(out.to_local(), (full.sin() * 2).cos())
        out.to_local().sum().backward()
        self.assertIs(type(x.grad), DTensor)
        # Equal, not always the caller's object: from the second call on,
        # the input's grad carries the mesh of the call that compiled the
        # graph, on torch 2.13 native as with install(dtensor=True) (the
        # output above does carry the caller's mesh).
        self.assertEqual(x.grad.device_mesh, mesh)
        self.assertEqual(x.grad.full_tensor(), -torch.sin(full.sin() * 2) * 2 * full.cos())

    def _fwd_bwd(self, device, backend):
        f = self.compile(lambda x: (x.sin() * 2).cos().redistribute(placements=[Replicate()]), backend)
        self._run(f, device, fixtures.mesh("dp"))
        self.assertEqual(self.counter.frame_count, 1)
        if self.recorder is not None:
            self.assertTrue(self.recorder.fw_graphs and self.recorder.bw_graphs)
            for gm in (*self.recorder.fw_graphs, *self.recorder.bw_graphs):
                # the mesh is a graph input, never a module attribute
                self.assertNotIn("get_attr", str(gm.graph))

    def test_flatten_lists_device_mesh(self, device):
        x = distribute_tensor(torch.randn(4, device=device), fixtures.mesh("dp"), [Shard(0)])
        attrs, ctx = x.__tensor_flatten__()
        self.assertEqual(attrs, ["_local_tensor", "device_mesh"])
        self.assertNotIn(x.device_mesh, [c for c in ctx if isinstance(c, DeviceMesh)])
        y = DTensor.__tensor_unflatten__(
            {"_local_tensor": x._local_tensor, "device_mesh": fixtures.mesh("dp")}, ctx, x.shape, x.stride()
        )
        self.assertEqual(y.placements, x.placements)
        self.assertIsNot(y.device_mesh, x.device_mesh)

    def test_fake_mesh_equals_its_mesh(self, device):
        # a traced DTensor compares its (fake) mesh with others: fakes of one
        # mesh, and a fake and its mesh, are equal and hash alike (2.13)
        from torch._library.fake_class_registry import maybe_to_fake_obj
        from torch._subclasses.fake_tensor import FakeTensorMode

        mesh = fixtures.mesh("dp")
        fake, other = (maybe_to_fake_obj(FakeTensorMode(), mesh) for _ in range(2))
        self.assertIsNot(fake, other)
        self.assertTrue(fake == other and fake == mesh and not fake != other)
        # hashed as its mesh (2.13; install() and the series' 0022 on 2.11,
        # whose tracer then keys fakes by identity, see below)
        self.assertEqual(hash(fake), hash(other))
        self.assertTrue(fake != fixtures.mesh("tp"))

    @unittest.skipIf(
        harness.torch_major_minor() >= (2, 12), "torch >= 2.12 tracks opaques by id (opaque_tracker)"
    )
    def test_fakes_of_one_object_tracked_apart(self, device):
        # 2.11's proxy tracer keys FakeScriptObjects by hash (_WeakHashRef),
        # which install() (and the series' 0022) make identity for fakes: two
        # fakes of one object (two inputs sharing it) must stay two keys, or
        # they become one graph input
        from torch._library.fake_class_registry import maybe_to_fake_obj
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.proxy_tensor import PythonKeyTracer

        mesh = fixtures.mesh("dp")
        fake, other = (maybe_to_fake_obj(FakeTensorMode(), mesh) for _ in range(2))
        tracker = PythonKeyTracer().script_object_tracker
        tracker[fake], tracker[other] = 1, 2
        self.assertEqual(len(tracker), 2)

    def test_fake_without_real_object_compares(self, device):
        # a FakeScriptObject whose real object is None (a torchbind fake
        # built without one) must still compare: equal to itself, and no
        # endless __eq__ recursion against another such fake
        from torch._library.fake_class_registry import FakeScriptObject

        a, b = (FakeScriptObject(object(), "x", None) for _ in range(2))
        self.assertTrue(a == a)
        a == b  # noqa: B015 - only must not raise (2.13: True, 2.11 series: False)
        self.assertFalse(a == 1)

    def test_dtensor_input_fwd_bwd_aot_eager(self, device):
        self._fwd_bwd(device, "aot_eager")

    def test_dtensor_input_fwd_bwd_inductor(self, device):
        self._fwd_bwd(device, "inductor")

    def _redistribute_own_mesh(self, device, backend):
        # the mesh passed to redistribute in the compiled code is the
        # input's own (positional, keyword): one graph for equal meshes, the
        # output on the caller's mesh; and a global mesh that is the input's
        # mesh object (Dynamo maps it to that same graph input)
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache

        glob = fixtures.mesh("dp")
        cases = (
            (lambda x: (x.sin() * 2).cos().redistribute(x.device_mesh, [Replicate()]), 2),
            (lambda x: (x.sin() * 2).cos().redistribute(device_mesh=x.device_mesh, placements=[Replicate()]), 2),
            (lambda x: (x.sin() * 2).cos().redistribute(glob, [Replicate()]), 1),
        )
        for fn, calls in cases:
            torch._dynamo.reset()
            _clear_sharding_prop_cache()  # see setUp
            f = self.compile(fn, backend)
            for mesh in (glob, fixtures.mesh("dp"))[:calls]:
                self._run(f, device, mesh)
            self.assertEqual(self.counter.frame_count, 1)

    def test_redistribute_own_mesh_aot_eager(self, device):
        self._redistribute_own_mesh(device, "aot_eager")

    def test_redistribute_own_mesh_inductor(self, device):
        self._redistribute_own_mesh(device, "inductor")

    def test_equal_meshes_one_compile(self, device):
        f = self.compile(lambda x: (x.sin() * 2).cos().redistribute(placements=[Replicate()]))
        first, second = fixtures.mesh("dp"), fixtures.mesh("dp")
        self.assertIsNot(first, second)
        self.assertEqual(first, second)
        self._run(f, device, first)
        self._run(f, device, second)
        self.assertEqual(self.counter.frame_count, 1)

    def test_other_dim_names_recompile(self, device):
        f = self.compile(lambda x: (x.sin() * 2).cos().redistribute(placements=[Replicate()]))
        self._run(f, device, fixtures.mesh("dp"))
        self._run(f, device, fixtures.mesh("tp"))
        self.assertEqual(self.counter.frame_count, 2)

    def _aot_over_dynamo(self, device, requires_grad):
        # AOTAutograd traces a function that calls a Dynamo-compiled one,
        # which it keeps as an invoke_subgraph HOP: the subgraph's DTensor
        # output is (local, mesh), and its mesh output must be its mesh
        # input (meta["val"] set), not a constant without one (KeyError:
        # 'example_value' in invoke_subgraph's schema on 2.11).
        from torch._functorch.aot_autograd import aot_function
        from torch._functorch.compilers import nop

        counter = CompileCounterWithBackend("invoke_subgraph")
        inner = torch.compile(lambda dt: dt.sin() * 2 + 1, backend=counter)
        f = aot_function(
            # sin(sin(.)) saves a tensor computed after the subgraph
            # returns its mesh: the saved mesh is not the last saved value
            lambda dt: inner(dt + 1).sin().sin().sum(),
            fw_compiler=lambda gm, _: gm,
            bw_compiler=nop,
            _disable_torch_fn_metadata_mode=True,
        )
        local = torch.randn(4, 4, device=device, requires_grad=requires_grad)
        x = DTensor.from_local(local, fixtures.mesh("dp"), [Shard(0)], run_check=False)
        with torch._dynamo.config.patch(force_compile_during_fx_trace=True):
            out = f(x)
        self.assertEqual(counter.frame_count, 1)
        self.assertEqual(out.full_tensor(), ((local.detach() + 1).sin() * 2 + 1).sin().sin().sum())
        return local, out

    def test_aot_over_dynamo_mesh_output(self, device):
        self._aot_over_dynamo(device, requires_grad=False)

    def test_aot_over_dynamo_mesh_output_backward(self, device):
        # the subgraph's mesh output is saved for backward: a real opaque,
        # stashed with the saved opaques, not checked as a tensor
        local, out = self._aot_over_dynamo(device, requires_grad=True)
        out.backward()
        ref = local.detach().clone().requires_grad_(True)
        ((ref + 1).sin() * 2 + 1).sin().sin().sum().backward()
        self.assertEqual(local.grad, ref.grad)

    @unittest.skipIf(MODE != "backport", "compare's installed run uses the backport")
    def test_compare_dtensor_flag_installs_group(self, device):
        # `python -m torch_subclass_rt compare --dtensor` hands its installed
        # run TSRT_COMPARE_INSTALL=1+dtensor: install(dtensor=True) there
        from unittest import mock

        from torch_subclass_rt import compare

        tsrt.uninstall()
        with mock.patch.dict("os.environ", {compare.INSTALL_ENV: "1+dtensor"}):
            compare.install_from_env()
        self.assertTrue(set(tsrt.status().points) & _dtensor_group_points())
        with mock.patch.dict("os.environ", {compare.INSTALL_ENV: "1+dtensr"}):
            with self.assertRaisesRegex(RuntimeError, "expected '1' or 'force'"):
                compare.install_from_env()

    # patched: the series makes the flatten unconditional (as torch 2.12+),
    # there is nothing to install (test_flatten_lists_device_mesh covers it)
    @unittest.skipIf(MODE == "patched", "install() is not used with the patch series")
    def test_install_without_dtensor_leaves_flatten(self, device):
        # install() alone must be invisible to DTensor (torch's own flatten,
        # the very same functions); dtensor=True switches to the mesh-attr
        # flatten and uninstall() puts torch's functions back
        def flatten_attrs():
            x = distribute_tensor(torch.randn(4, device=device), fixtures.mesh("dp"), [Shard(0)])
            return x.__tensor_flatten__()[0]

        from torch._library.fake_class_registry import FakeScriptObject

        force = MODE == "forced"
        tsrt.uninstall()
        torch_fns = dict(DTensor.__dict__)
        torch_fake_fns = dict(FakeScriptObject.__dict__)
        native_attrs = flatten_attrs()
        tsrt.install(force=force)
        self.assertEqual(flatten_attrs(), native_attrs)
        for name in ("__tensor_flatten__", "__tensor_unflatten__", "__coerce_same_metadata_as_tangent__"):
            self.assertIs(DTensor.__dict__[name], torch_fns[name])
        tsrt.install(force=force, dtensor=True)
        self.assertEqual(flatten_attrs(), ["_local_tensor", "device_mesh"])
        tsrt.uninstall()
        self.assertEqual(dict(DTensor.__dict__), torch_fns)
        self.assertEqual(dict(FakeScriptObject.__dict__), torch_fake_fns)
        self.assertEqual(flatten_attrs(), native_attrs)
        if harness.torch_major_minor() >= (2, 12):
            # 2.12 (PR 178115) flattens this way natively; dtensor=True adds no point
            self.assertEqual(native_attrs, ["_local_tensor", "device_mesh"])
            st = tsrt.install(force=force, dtensor=True)
            self.assertFalse(set(st.points) & _dtensor_group_points())
        else:
            self.assertEqual(native_attrs, ["_local_tensor"])


harness.instantiate_cpu_and_cuda(TestDTensorOpaqueMesh, globals())

if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
