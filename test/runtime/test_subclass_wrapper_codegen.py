"""The generated per-call subclass wrapper (torch_subclass_rt.runtime.codegen).

On torch 2.11 (backport) every compiled forward with subclass inputs or
outputs runs through it; the generated source is checked against
test/expected/ for a flat, a nested and a dynamic-shape case, and the
function itself against hand-built metadata (any torch: it is pure code).
"""

from __future__ import annotations

import unittest

import harness
from fixtures import Scaled, runtime_metas

import torch
from torch._dynamo.test_case import TestCase

from torch_subclass_rt.examples.mesh_tensor import MeshHandle, MeshTensor
from torch_subclass_rt.runtime import codegen

MODE = harness.current_mode()

CODEGEN_LOGGER = codegen.log.name


class TestGeneratedWrapper(TestCase):
    """The generated function on eager metadata: what it passes to the
    compiled function and how it rebuilds outputs."""

    def build(self, inputs, outputs, num_saved=None):
        seen = {}

        def compiled_fn(flat):
            seen["flat"] = list(flat)
            return seen["outs"]

        def torch_loop(args):
            seen["torch_loop"] = list(args)
            return "from torch's loop"

        fn = codegen.build_subclass_wrapper(
            compiled_fn, runtime_metas(inputs), runtime_metas(outputs), num_saved, torch_loop
        )
        return fn, seen

    def test_flat_opaque_slot_in_and_out(self):
        mesh, new_mesh = MeshHandle("a"), MeshHandle("b")
        x = MeshTensor(torch.randn(3), mesh)
        plain = torch.randn(2)
        fn, seen = self.build([x, plain], [x])
        out_local = torch.randn(3)
        seen["outs"] = [out_local, new_mesh]
        args = [x, plain, "rng-seed"]
        (out,) = fn(args)
        self.assertEqual(args, [], "boxed call: the wrapper clears its args")
        self.assertEqual(len(seen["flat"]), 4)
        self.assertIs(seen["flat"][0], x._local)
        self.assertIs(seen["flat"][1], mesh)
        self.assertIs(seen["flat"][2], plain)
        self.assertEqual(seen["flat"][3], "rng-seed")  # trailing arg passed through
        self.assertIs(type(out), MeshTensor)
        self.assertIs(out._local, out_local)
        self.assertIs(out.mesh, new_mesh, "rebuilt with the object the graph returned")

    def test_nested_and_saved_activations(self):
        mesh = MeshHandle("n")
        x = Scaled(MeshTensor(torch.randn(2), mesh), 3.0)
        fn, seen = self.build([x], [x, torch.randn(2)], num_saved=1)
        local, plain, saved = torch.randn(2), torch.randn(2), torch.randn(1)
        seen["outs"] = [local, mesh, plain, saved]
        out, out_plain, out_saved = fn([x])
        self.assertEqual(seen["flat"], [x.inner._local, mesh])
        self.assertIs(type(out), Scaled)
        self.assertEqual(out.scale, 3.0)
        self.assertIs(out.inner.mesh, mesh)
        self.assertIs(out_plain, plain)
        self.assertIs(out_saved, saved)

    def test_other_input_types_go_to_torch_loop(self):
        """Inductor freezing passes None (or a plain tensor) where the metadata
        says subclass; torch's loop takes those, so they go to it, untouched."""
        x = MeshTensor(torch.randn(3), MeshHandle())
        plain = torch.randn(2)
        fn, seen = self.build([plain, x], [])
        seen["outs"] = []
        for other in (None, torch.randn(3)):
            seen.pop("flat", None)
            args = [plain, other, "rng-seed"]
            self.assertEqual(fn(args), "from torch's loop")
            self.assertEqual(seen["torch_loop"][1:], [other, "rng-seed"])
            self.assertIs(seen["torch_loop"][0], plain)
            self.assertNotIn("flat", seen, "the generated code must not call compiled_fn")

    def test_wrong_output_count_is_reported(self):
        x = MeshTensor(torch.randn(3), MeshHandle())
        fn, seen = self.build([x], [x])
        seen["outs"] = [torch.randn(3)]
        with self.assertRaisesRegex(AssertionError, r"returned 1 values, expected 2 \(outputs\)"):
            fn([x])


class TestGeneratedWrapperDebuggable(TestCase):
    """The generated wrapper debugs like torch.fx's generated code: its text
    is in linecache (tracebacks, pdb, inspect), in the structured trace
    (tlparse) and in the module log."""

    def build_with_bad_outputs(self):
        x = MeshTensor(torch.randn(3), MeshHandle())
        fn = codegen.build_subclass_wrapper(
            lambda flat: [torch.randn(3)], runtime_metas([x]), runtime_metas([x]), None,
            lambda args: None,
        )
        return fn, x

    def test_traceback_shows_generated_line(self):
        import traceback

        fn, x = self.build_with_bad_outputs()
        try:  # not assertRaises: it drops the traceback
            fn([x])
        except AssertionError as e:
            text = "".join(traceback.format_exception(e))
        else:
            self.fail("no error")
        self.assertIn("codegen.py:subclass_wrapper#", text)
        self.assertIn("if len(outs) != 2: raise _bad_output_count", text)

    def test_inspect_getsource(self):
        import inspect

        fn, _ = self.build_with_bad_outputs()
        src = inspect.getsource(fn)
        self.assertTrue(src.startswith("def subclass_wrapper(args):\n"), src)
        self.assertIn("outs = compiled_fn(flat)", src)

    def test_same_text_one_linecache_entry(self):
        import linecache

        fn1, _ = self.build_with_bad_outputs()
        fn2, _ = self.build_with_bad_outputs()
        name = fn1.__code__.co_filename
        self.assertEqual(name, fn2.__code__.co_filename, "keyed by the text")
        self.assertIn(name, linecache.cache)
        linecache.checkcache()  # what every traceback does; no file to stat
        self.assertIn(name, linecache.cache)

    def test_trace_artifact_and_debug_log(self):
        with harness.captured_trace_artifacts() as artifacts, self.assertLogs(
            CODEGEN_LOGGER, "DEBUG"
        ) as logs:
            fn, _ = self.build_with_bad_outputs()
        import inspect

        source = inspect.getsource(fn)
        self.assertEqual(
            artifacts.get("torch_subclass_rt_subclass_wrapper"), [("string", source)]
        )
        self.assertEqual(
            [r.getMessage() for r in logs.records], [f"generated subclass wrapper:\n{source}"]
        )


@unittest.skipIf(MODE != "backport", "the generated wrapper replaces torch 2.11's loop; "
                 "torch >= 2.13 generates its own (subclass_codegen)")
class TestGeneratedWrapperSource(TestCase):
    """What torch.compile actually runs per call on torch 2.11."""

    def generated_sources(self, fn, *args, **compile_kwargs):
        torch._dynamo.reset()
        with self.assertLogs(CODEGEN_LOGGER, "DEBUG") as logs:
            out = torch.compile(fn, backend="aot_eager", fullgraph=True, **compile_kwargs)(*args)
        return out, "\n".join(r.getMessage() for r in logs.records)

    def test_flat(self):
        mesh = MeshHandle()
        out, src = self.generated_sources(lambda x: x.sin() + 1, MeshTensor(torch.randn(4), mesh))
        self.assertIs(out.mesh, mesh)
        harness.assertExpectedGraph(self, src, "source")

    def test_nested_with_grad(self):
        mesh = MeshHandle()
        x = Scaled(MeshTensor(torch.randn(4), mesh), 2.0).requires_grad_()
        out, src = self.generated_sources(lambda x: x * 2, x)
        self.assertIs(out.inner.mesh, mesh)
        harness.assertExpectedGraph(self, src, "source")

    def test_dynamic_two_dim(self):
        mesh = MeshHandle()
        x = MeshTensor(torch.randn(4, 6), mesh)
        out, src = self.generated_sources(lambda x: x.cos(), x, dynamic=True)
        self.assertIs(out.mesh, mesh)
        self.assertEqual(out.shape, (4, 6))
        harness.assertExpectedGraph(self, src, "source")


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
