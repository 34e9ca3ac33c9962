"""Cases that need a patch point no other suite exercises (ours).

Each test here is named in the ``guarded_by`` of the point it guards and fails
when ``install()`` leaves that point out (tools/ablate_points.py checks that).
The cases are ones a user can hit: they pass on native torch >= 2.12, and on
2.10/2.11 only with the point in place. The ``TestOurRuntimeRuns`` cases are for
forced mode, whose points replace torch 2.13's working runtime with ours: there
what must hold is that 2.13's callers really run our code.
"""

from __future__ import annotations

import sys
import threading
import unittest

import harness

import torch
import torch.utils._pytree as pytree
from torch._dynamo.test_case import TestCase
from torch._dynamo.testing import AotEagerAndRecordGraphs, CompileCounterWithBackend

import torch_subclass_rt as tsrt
from torch_subclass_rt.examples.mesh_tensor import MeshHandle, MeshTensor

MODE = harness.current_mode()


class Config(tsrt.OpaqueBase):
    """A value-type opaque: compared by __eq__, belongs in the flatten context."""

    def __init__(self, n):
        self.n = n

    def __eq__(self, other):
        return isinstance(other, Config) and self.n == other.n

    def __hash__(self):
        return hash(self.n)

    def __repr__(self):  # torch 2.10 prints value-type opaques with repr()
        return self.__fx_repr__()[0]

    def __fx_repr__(self):
        return f"Config({self.n})", {"Config": Config}


tsrt.register_opaque(Config, typ="value")


def _wrapper(cls, local, outer_size=None, outer_stride=None):
    return torch.Tensor._make_wrapper_subclass(
        cls,
        outer_size if outer_size is not None else local.size(),
        strides=outer_stride if outer_stride is not None else local.stride(),
        dtype=local.dtype,
        device=local.device,
        layout=local.layout,
        requires_grad=local.requires_grad,
    )


class InplaceMeshTensor(torch.Tensor):
    """MeshTensor whose in-place ops update the local tensor and return self."""

    @staticmethod
    def __new__(cls, local, mesh, outer_size=None, outer_stride=None):
        return _wrapper(cls, local, outer_size, outer_stride)

    def __init__(self, local, mesh, outer_size=None, outer_stride=None):
        self._local = local
        self.mesh = mesh

    def __repr__(self):
        return f"InplaceMeshTensor({self._local}, {self.mesh!r})"

    def __tensor_flatten__(self):
        return ["_local", "mesh"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return InplaceMeshTensor(inner["_local"], inner["mesh"], outer_size, outer_stride)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        mesh = next(a.mesh for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, cls))
        u_args, u_kwargs = pytree.tree_map_only(cls, lambda t: t._local, (args, kwargs))
        out = func(*u_args, **u_kwargs)
        if func._schema.is_mutable and isinstance(args[0], cls):
            return args[0]
        return pytree.tree_map_only(torch.Tensor, lambda t: cls(t, mesh), out)


class ValueConfigTensor(torch.Tensor):
    """Wrongly lists a value-type opaque among its inner attrs."""

    @staticmethod
    def __new__(cls, local, config, outer_size=None, outer_stride=None):
        return _wrapper(cls, local, outer_size, outer_stride)

    def __init__(self, local, config, outer_size=None, outer_stride=None):
        self._local = local
        self.config = config

    def __repr__(self):
        return f"ValueConfigTensor({self._local}, {self.config!r})"

    def __tensor_flatten__(self):
        return ["_local", "config"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return ValueConfigTensor(inner["_local"], inner["config"], outer_size, outer_stride)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        config = next(a.config for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, cls))
        u_args, u_kwargs = pytree.tree_map_only(cls, lambda t: t._local, (args, kwargs))
        out = func(*u_args, **u_kwargs)
        return pytree.tree_map_only(torch.Tensor, lambda t: cls(t, config), out)


#: the handle every DefaultMeshTensor op result lives on
DEFAULT_MESH = MeshHandle("default")


class DefaultMeshTensor(torch.Tensor):
    """Op results always carry the module-level DEFAULT_MESH, whatever the
    inputs hold: inside AOTAutograd's trace that is a *real* handle, not the
    FakeScriptObject of any graph input."""

    @staticmethod
    def __new__(cls, local, mesh, outer_size=None, outer_stride=None):
        return _wrapper(cls, local, outer_size, outer_stride)

    def __init__(self, local, mesh, outer_size=None, outer_stride=None):
        self._local = local
        self.mesh = mesh

    def __repr__(self):
        return f"DefaultMeshTensor({self._local}, {self.mesh!r})"

    def __tensor_flatten__(self):
        return ["_local", "mesh"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return DefaultMeshTensor(inner["_local"], inner["mesh"], outer_size, outer_stride)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        u_args, u_kwargs = pytree.tree_map_only(cls, lambda t: t._local, (args, kwargs))
        out = func(*u_args, **u_kwargs)
        return pytree.tree_map_only(torch.Tensor, lambda t: cls(t, DEFAULT_MESH), out)


class MeshFirstTensor(InplaceMeshTensor):
    """A mesh tensor whose __tensor_flatten__ lists the mesh before the tensor."""

    def __tensor_flatten__(self):
        return ["mesh", "_local"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return MeshFirstTensor(inner["_local"], inner["mesh"], outer_size, outer_stride)


for _cls in (MeshHandle, MeshTensor, InplaceMeshTensor, DefaultMeshTensor, Config):
    harness.register_type_name_normalization(_cls)


class TestPointGuards(TestCase):
    def test_opaque_meta_defined_in_schemas(self):
        # Code written against torch >= 2.12 finds the opaque-slot marker in
        # AOTAutograd's schemas, and it is what the subclass metadata holds.
        from torch._functorch._aot_autograd import schemas, subclass_utils
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode() as mode:
            fake = MeshTensor(mode.from_tensor(torch.zeros(2)), MeshHandle())
        (meta,) = subclass_utils.create_subclass_meta([fake])
        self.assertIs(type(meta.attrs["mesh"]), schemas.OpaqueMeta)

    def test_opaque_meta_reexported(self):
        from torch._functorch import aot_autograd
        from torch._functorch._aot_autograd import schemas

        self.assertIs(aot_autograd.OpaqueMeta, schemas.OpaqueMeta)

    def test_input_mutation_under_no_grad(self):
        def fn(x):
            with torch.no_grad():
                x.mul_(2)
            return x + 1

        mesh, mesh2 = MeshHandle("a"), MeshHandle("b")
        cnt = CompileCounterWithBackend("aot_eager")
        opt_fn = torch.compile(fn, backend=cnt, fullgraph=True)
        for m in (mesh, mesh2):
            x = InplaceMeshTensor(torch.ones(3), m)
            out = opt_fn(x)
            self.assertEqual(x._local, torch.full((3,), 2.0))
            self.assertEqual(out._local, torch.full((3,), 3.0))
            self.assertIs(out.mesh, m)
            self.assertIs(x.mesh, m)
        self.assertEqual(cnt.frame_count, 1)

    def test_value_type_opaque_in_tensor_attrs_errors_eager_backend(self):
        # backend="eager" never reaches AOTAutograd, whose subclass metadata
        # would reject the value-type opaque too: Dynamo must do it.
        opt_fn = torch.compile(lambda x: x * 2, backend="eager", fullgraph=True)
        with self.assertRaisesRegex(
            Exception,
            "Config.*tensor attrs.*Only tensors and reference-type opaques are "
            "allowed in tensor attrs",
        ):
            opt_fn(ValueConfigTensor(torch.ones(3), Config(1)))

    def test_dispatch_attached_handle_is_the_handle(self):
        # __torch_dispatch__ puts a module-level handle on its results, which
        # is also the input's mesh. AOTAutograd fakeifies that real handle when
        # it unwraps the output: a new FakeScriptObject of an object already
        # traced as a graph input, so the output must be that input.
        rec = AotEagerAndRecordGraphs()
        opt_fn = torch.compile(lambda x: x.sin() + 1, backend=rec, fullgraph=True)
        x = DefaultMeshTensor(torch.randn(3, requires_grad=True), DEFAULT_MESH)
        out = opt_fn(x)
        self.assertIs(out.mesh, DEFAULT_MESH)
        self.assertEqual(out._local, x._local.sin() + 1)
        out.sum().backward()
        self.assertIs(x.grad.mesh, DEFAULT_MESH)
        harness.assertExpectedGraphs(self, rec)

    def test_parametrized_subclass_assigned_again(self):
        from torch._functorch._aot_autograd.subclass_parametrization import (
            unwrap_tensor_subclass_parameters,
        )

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.p = torch.nn.Parameter(MeshTensor(torch.zeros(3), MeshHandle("a")))

            def forward(self, x):
                return x + self.p

        m = M()
        unwrap_tensor_subclass_parameters(m)
        mesh2 = MeshHandle("b")
        m.p = MeshTensor(torch.ones(3), mesh2)  # right_inverse of the list
        self.assertIs(m.p.mesh, mesh2)
        self.assertEqual(m.p._local, torch.ones(3))
        self.assertIs(m.parametrizations.p.original1, mesh2)
        self.assertEqual(
            sorted(n for n, _ in m.named_parameters()), ["parametrizations.p.original0"]
        )
        out = m(torch.ones(3))
        self.assertIs(out.mesh, mesh2)

    @unittest.skipUnless(torch.distributed.is_available(), "needs torch.distributed")
    def test_fsdp_sync_module_states_skips_opaque_attrs(self):
        # FSDP(sync_module_states=True) gathers every inner attr of a subclass
        # parameter to check its device and broadcast it; an opaque is neither,
        # so only the inner tensor may reach the check (which reads each
        # state's .device: the mesh's first, here, when it is not skipped).
        # On CPU the check then refuses the module with FSDP's own message.
        from unittest import mock

        from torch.distributed.fsdp import _init_utils

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.p = torch.nn.Parameter(MeshFirstTensor(torch.zeros(3), MeshHandle()))

        m = M()
        checked = []
        check = _init_utils._check_module_states_for_sync_module_states

        def record(states):
            checked.extend(states)
            return check(states)

        with mock.patch.object(
            _init_utils, "_check_module_states_for_sync_module_states", side_effect=record
        ), self.assertRaisesRegex(ValueError, "CPU parameters or buffers"):
            _init_utils._sync_module_params_and_buffers(m, list(m.parameters()), None)
        self.assertEqual([type(s) for s in checked], [torch.Tensor], checked)


# --------------------------------------------------------------------------
# forced mode: torch 2.13's callers run our runtime


def _code_objects_run(fn) -> set:
    seen = set()

    def profile(frame, event, arg):
        if event == "call":
            seen.add(frame.f_code)

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return seen


@unittest.skipUnless(MODE == "forced", "forced mode replaces torch's runtime with ours")
class TestOurRuntimeRuns(TestCase):
    """A compile, forward and backward of a subclass with an opaque attr runs
    each function of our runtime that forced mode installs, from 2.13's own
    call sites (the forced suite proves nothing about a function never called)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()

        def compile_and_run():
            torch._dynamo.reset()
            opt_fn = torch.compile(lambda x: x * 2 + 1, backend="aot_eager", fullgraph=True)
            x = MeshTensor(torch.randn(3, requires_grad=True), MeshHandle())
            opt_fn(x).sum().backward()

        cls.seen = _code_objects_run(compile_and_run)

    def assertRan(self, fn):
        self.assertIn(fn.__code__, self.seen, f"{fn.__module__}.{fn.__qualname__} never ran")

    def test_runs_our_creation_fn(self):
        from torch_subclass_rt.runtime import wrap

        self.assertRan(wrap.creation_fn)

    def test_runs_our_create_subclass_metadata(self):
        from torch_subclass_rt.runtime import flatten

        self.assertRan(flatten.create_subclass_metadata)

    def test_runs_our_unwrap_tensor_subclasses(self):
        from torch_subclass_rt.runtime import flatten

        self.assertRan(flatten.unwrap_tensor_subclasses)

    def test_runs_our_process_runtime_tangent(self):
        # the tangent of a MeshTensor output holds the mesh in its opaque slot
        from torch_subclass_rt.runtime import tangents

        self.assertRan(tangents.process_runtime_tangent)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
