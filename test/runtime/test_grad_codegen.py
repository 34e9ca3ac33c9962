"""The generated grad rebuild of the compiled backward (runtime/grad_codegen.py).

The generated function must return what torch's walker
(``wrap_tensor_subclasses`` as the epilogue calls it) returns for the same
flat grads: the same types, the very inner tensors and opaques, the same
errors; the epilogue must hand every case it does not generate for to
torch's own function unchanged. On torch 2.11 (backport) the source torch
actually runs is checked against test/expected/.
"""

from __future__ import annotations

import unittest

import harness
from fixtures import Scaled, runtime_metas

import torch
from torch._dynamo.test_case import TestCase

from torch_subclass_rt.examples.mesh_tensor import MeshHandle, MeshTensor
from torch_subclass_rt.points import generated_wrappers
from torch_subclass_rt.runtime import grad_codegen
# torch's own function: with install() it builds the metadata through our
# create_subclass_metadata (its module global), natively with torch's
from torch._functorch._aot_autograd.subclass_utils import create_subclass_meta

MODE = harness.current_mode()

GRAD_LOGGER = grad_codegen.log.name


def walker(metas, outs):
    """What torch runs for the epilogue's subclass step in this mode."""
    from torch._functorch._aot_autograd import subclass_utils

    return subclass_utils.wrap_tensor_subclasses(
        outs, subclass_metas=metas, included_subclass_symints=True, is_runtime=True
    )


def leaves(x):
    """(type, inner objects by identity) of a rebuilt grad, recursively."""
    if isinstance(x, MeshTensor):
        return (MeshTensor, id(x._local), id(x.mesh), tuple(x.shape))
    if isinstance(x, Scaled):
        return (Scaled, x.scale, leaves(x.inner))
    return (type(x), id(x))


class TestGeneratedGradWrapper(TestCase):
    """The generated function against torch's walker on the same metadata."""

    def build(self, grads):
        metas = runtime_metas(grads)
        return metas, grad_codegen.build_grad_wrapper(metas, lambda outs: walker(metas, outs))

    def flat_grads(self, grads):
        """Fresh flat values in the layout of ``grads``' metadata."""
        out = []
        for g in grads:
            if isinstance(g, Scaled):
                out += [torch.randn(g.shape), g.inner.mesh]
            elif isinstance(g, MeshTensor):
                out += [torch.randn(g.shape), g.mesh]
            else:
                out.append(torch.randn(g.shape))
        return tuple(out)

    def assertSameAsWalker(self, grads):
        metas, fn = self.build(grads)
        outs = self.flat_grads(grads)
        got, want = fn(outs), walker(metas, outs)
        self.assertEqual([leaves(g) for g in got], [leaves(w) for w in want])
        return got

    def test_plain_and_subclass_grads(self):
        shared = MeshHandle("shared")
        grads = [
            torch.randn(2),
            MeshTensor(torch.randn(3), MeshHandle("a")),
            MeshTensor(torch.randn(3), shared),
            MeshTensor(torch.randn(4, 2), shared),
        ]
        got = self.assertSameAsWalker(grads)
        self.assertIs(got[2].mesh, got[3].mesh)

    def test_nested(self):
        self.assertSameAsWalker([Scaled(MeshTensor(torch.randn(3), MeshHandle()), 2.0)])

    def test_no_grads(self):
        metas, fn = self.build([])
        self.assertEqual(fn(()), walker(metas, ()))

    def test_wrong_count_raises_what_the_walker_raises(self):
        grads = [MeshTensor(torch.randn(3), MeshHandle()), torch.randn(2)]
        metas, fn = self.build(grads)
        outs = self.flat_grads(grads)
        for bad in (outs[:-1], outs[:1], outs + (torch.randn(1),)):
            with self.assertRaises(Exception) as want:
                walker(metas, bad)
            with self.assertRaises(type(want.exception)) as got:
                fn(bad)
            self.assertEqual(str(got.exception), str(want.exception))

    def test_metadata_without_symints_is_left_to_torch(self):
        metas = metas_without_symints(MeshTensor(torch.randn(3), MeshHandle()))
        with self.assertRaises(grad_codegen._NotGenerated):
            grad_codegen.grad_wrapper_source(metas, walker)


class TestGeneratedGradWrapperDebuggable(TestCase):
    """Same debugging aids as the forward wrapper (linecache, structured
    trace, DEBUG log), through the one helper both use."""

    def test_traceback_artifact_and_log(self):
        import inspect
        import traceback

        x = MeshTensor(torch.randn(3), MeshHandle())
        metas = runtime_metas([x])

        def walk(outs):
            raise RuntimeError("walker reached")

        with harness.captured_trace_artifacts() as artifacts, self.assertLogs(
            GRAD_LOGGER, "DEBUG"
        ) as logs:
            fn = grad_codegen.build_grad_wrapper(metas, walk)
        source = inspect.getsource(fn)
        self.assertTrue(source.startswith("def grad_wrapper(outs):\n"), source)
        self.assertEqual(artifacts.get("torch_subclass_rt_grad_wrapper"), [("string", source)])
        self.assertEqual([r.getMessage() for r in logs.records],
                         [f"generated grad wrapper:\n{source}"])
        try:  # not assertRaises: it drops the traceback
            fn((torch.randn(3),))  # wrong count: the generated line defers to walk
        except RuntimeError as e:
            text = "".join(traceback.format_exception(e))
        else:
            self.fail("no error")
        self.assertIn("grad_codegen.py:grad_wrapper#", text)
        self.assertIn("if len(outs) != 2: return _walk", text)


def metas_without_symints(x):
    from torch._subclasses.fake_tensor import FakeTensorMode

    return create_subclass_meta([FakeTensorMode().from_tensor(x)], count_symints=False)


class FakeSubclassMeta:
    def __init__(self, grad_input_metas):
        self.grad_input_metas = grad_input_metas


class TestEpilogueDelegation(TestCase):
    """The epilogue point's build: torch's function does everything but the rebuild."""

    def setUp(self):
        super().setUp()
        self.calls = []

        def original(metadata, maybe_subclass_metadata, out, *, make_subclass_override=None):
            self.calls.append((maybe_subclass_metadata, make_subclass_override))
            if maybe_subclass_metadata is None:
                return tuple(out[:-1])  # stands in for dropping a backward token
            return ("torch", tuple(out))

        self.epilogue = generated_wrappers._build_backward_epilogue(original)

    def test_generated_after_torchs_flat_step(self):
        x = MeshTensor(torch.randn(3), MeshHandle())
        meta = FakeSubclassMeta(runtime_metas([x]))
        local, token = torch.randn(3), torch.randn(1)
        for _ in range(2):
            (g,) = self.epilogue("md", meta, [local, x.mesh, token])
            self.assertIs(g._local, local)
            self.assertIs(g.mesh, x.mesh)
        self.assertEqual(self.calls, [(None, None), (None, None)])
        self.assertIn(meta, generated_wrappers._generated, "generated once, kept per metadata")

    def test_other_cases_go_to_torch_unchanged(self):
        x = MeshTensor(torch.randn(3), MeshHandle())
        override = object()
        cases = [
            (None, None),
            (FakeSubclassMeta(None), None),
            (FakeSubclassMeta(runtime_metas([x])), override),
            (FakeSubclassMeta(metas_without_symints(x)), None),
        ]
        for meta, ov in cases:
            self.calls.clear()
            out = self.epilogue("md", meta, [1, 2], make_subclass_override=ov)
            self.assertEqual(self.calls, [(meta, ov)])
            self.assertEqual(out, (1,) if meta is None else ("torch", (1, 2)))


@unittest.skipIf(MODE != "backport", "the generated grad rebuild replaces torch 2.11's "
                 "walker; torch >= 2.13 generates its own (codegen_backward_subclass_fns)")
class TestGeneratedGradWrapperCompiled(TestCase):
    """What a compiled backward runs on torch 2.11, against eager."""

    def run_both(self, fn, make_inputs, **compile_kwargs):
        torch.manual_seed(0)
        eager_xs = make_inputs()
        torch.manual_seed(0)
        compiled_xs = make_inputs()
        fn(eager_xs).backward()
        torch._dynamo.reset()
        with self.assertLogs(GRAD_LOGGER, "DEBUG") as logs:
            torch.compile(fn, backend="aot_eager", fullgraph=True, **compile_kwargs)(
                compiled_xs
            ).backward()
        for e, c in zip(eager_xs, compiled_xs):
            self.assertIs(type(c.grad), type(e.grad))
            self.assertEqual(c.grad, e.grad)
            if isinstance(e.grad, MeshTensor):
                # the handle eager's grad carries, of the compiled run's inputs
                def owner(xs, mesh):
                    return next(i for i, x in enumerate(xs) if x.mesh is mesh)

                self.assertEqual(owner(compiled_xs, c.grad.mesh), owner(eager_xs, e.grad.mesh))
        return "\n".join(r.getMessage() for r in logs.records)

    def test_distinct_and_shared_handles(self):
        shared = MeshHandle("shared")

        def make():
            return [
                MeshTensor(torch.randn(3, requires_grad=True), MeshHandle("a")),
                MeshTensor(torch.randn(3, requires_grad=True), shared),
                MeshTensor(torch.randn(3, requires_grad=True), shared),
            ]

        def f(xs):
            return sum((x * 2 + 1).sum() for x in xs)

        harness.assertExpectedGraph(self, self.run_both(f, make), "source")

    def test_dynamic_two_dim(self):
        def make():
            return [MeshTensor(torch.randn(4, 6, requires_grad=True), MeshHandle())]

        def f(xs):
            return (xs[0].cos() * 3).sum()

        src = self.run_both(f, make, dynamic=True)
        self.assertIn("outs[2]", src, "symbolic sizes come from the flat grads")
        harness.assertExpectedGraph(self, src, "source")


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
