"""Bugs in native torch's opaque-in-subclass support that upstream fixed
after a release, each reproduced on every release that has it.

Every test is marked :func:`harness.upstream_bug` with the upstream PR and the
releases that ship the bug: run in mode ``native`` (nothing installed) on
such a release it must fail (xfail); with ``install()`` (``native+fixes``,
``forced``, ``backport``) or the patch series (``patched``) it must pass.
The fixes are the points in the point modules named in each test's ``upstream_bug`` (points/__init__.py, Note [Upstream fixes]).
Test names follow the upstream tests of the same cases.
"""

from __future__ import annotations

import io
import os
import tempfile
import unittest
import zipfile
from unittest import mock

import harness

import torch
import torch._dynamo.exc
import torch.utils._pytree as pytree
from torch._dynamo.test_case import TestCase

import torch_subclass_rt as tsrt

MODE = harness.current_mode()

NATIVE = harness.torch_major_minor() >= (2, 12)


def _release_function(test, fixed, point: str):
    """The release's own function that the installed fix ``point`` wraps
    (``__wrapped__``); skips where the point is not installed."""
    if point not in tsrt.status().points:
        test.skipTest(f"the issue 179870 fix ({point}) is not installed (mode {MODE})")
    release = getattr(fixed, "__wrapped__", None)
    test.assertIsNotNone(
        release,
        f"{point} is installed but {fixed.__qualname__} has no __wrapped__ (the "
        "release's function it replaces): the fix lost its functools.wraps",
    )
    return release


class QuantConfig(tsrt.OpaqueBase):
    """A value-type opaque (compared by ``__eq__``): subclass metadata."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __eq__(self, other: object) -> bool:
        return isinstance(other, QuantConfig) and other.tag == self.tag

    def __hash__(self) -> int:
        return hash(self.tag)

    def __repr__(self):  # torch 2.10 prints value-type opaques with repr()
        return self.__fx_repr__()[0]

    def __fx_repr__(self):
        return f"QuantConfig({self.tag!r})", {"QuantConfig": QuantConfig}


class Quantizer(tsrt.OpaqueBase):
    """A value-type opaque that is also callable, like a quantizer."""

    def __init__(self, num_buffers: int) -> None:
        self.num_buffers = num_buffers

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def get_num_buffers(self) -> int:
        return self.num_buffers

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantizer) and other.num_buffers == self.num_buffers

    def __hash__(self) -> int:
        return hash(self.num_buffers)

    def __repr__(self):  # torch 2.10 prints value-type opaques with repr()
        return self.__fx_repr__()[0]

    def __fx_repr__(self):
        return f"Quantizer({self.num_buffers})", {"Quantizer": Quantizer}


# Members are declared: torch 2.11 only lets Dynamo read members of a value
# opaque that are registered (2.12 reads any).
tsrt.register_opaque(QuantConfig, typ="value", **harness.member_kwargs(tag="USE_REAL"))
tsrt.register_opaque(
    Quantizer, typ="value", **harness.member_kwargs(get_num_buffers="USE_REAL")
)


class Handle(tsrt.OpaqueBase):
    """A reference-type opaque (compared by identity), as export inputs or
    constants."""

    def __init__(self, n: int) -> None:
        self.n = n


tsrt.register_opaque(Handle, typ="reference")


class MetaTensor(torch.Tensor):
    """A wrapper subclass whose flatten *context* holds a value opaque."""

    @staticmethod
    def __new__(cls, data, meta):
        return torch.Tensor._make_wrapper_subclass(
            cls, data.shape, dtype=data.dtype, device=data.device
        )

    def __init__(self, data, meta):
        self._data = data
        self._meta = meta

    def __repr__(self):
        # the default repr reads values, which a fake tensor in a log line cannot
        return f"MetaTensor({self._data!r}, {type(self._meta).__name__})"

    def __tensor_flatten__(self):
        return ["_data"], {"meta": self._meta}

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return MetaTensor(inner["_data"], ctx["meta"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        meta = next(a._meta for a in pytree.tree_leaves(args) if isinstance(a, MetaTensor))
        args, kwargs = pytree.tree_map_only(MetaTensor, lambda t: t._data, (args, kwargs))
        out = func(*args, **kwargs)
        return pytree.tree_map_only(torch.Tensor, lambda t: MetaTensor(t, meta), out)


class TestUpstreamFixes(TestCase):
    @unittest.skipUnless(
        NATIVE,
        "needs value opaques as Dynamo graph outputs (upstream PR 177560, torch "
        ">= 2.12), which 2.11 lacks and the backport does not carry",
    )
    @harness.upstream_bug(
        "PR 193190 (on these releases; upstream also PR 187057, issue 187041)",
        broken_on=("2.12.0", "2.12.1", "2.13.0"),
        fails_with=(AssertionError,),
        # the stored object is the graph's fake, not the real one
        match=r"FakeScriptObject'> is not <class '[\w.]*QuantConfig'>",
    )
    def test_value_type_graph_output_subclass_metadata_side_effect(self):
        # A value opaque created in the graph is both subclass metadata and
        # stored through a side effect: the stored object must be the real
        # one (the buggy releases replay the graph's FakeScriptObject).
        store = {}

        def f(x):
            cfg = QuantConfig("int8")
            store["cfg"] = cfg
            return MetaTensor(x, cfg) * 2

        out = torch.compile(f, backend="aot_eager", fullgraph=True)(torch.ones(3))
        self.assertIsInstance(out, MetaTensor)
        self.assertEqual(out._data, torch.full((3,), 2.0))
        # type(), not isinstance: a FakeScriptObject passes isinstance checks
        # against the opaque class it wraps
        self.assertIs(type(out._meta), QuantConfig)
        self.assertIs(type(store["cfg"]), QuantConfig)
        self.assertEqual(store["cfg"], QuantConfig("int8"))

    @unittest.skipUnless(
        NATIVE,
        "needs value opaques as Dynamo graph outputs (upstream PR 177560, torch "
        ">= 2.12), which 2.11 lacks and the backport does not carry",
    )
    @harness.upstream_bug(
        "PR 193190", broken_on=("2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1"),
        fails_with=(AssertionError,),
        # a FakeScriptObject on a cold compile, None from the FX graph cache
        match=r"(FakeScriptObject|NoneType)'> is not <class '[\w.]*QuantConfig'>",
    )
    def test_opaque_constant_with_subclass_output_cache_hit(self):
        # A value opaque made in the graph is returned next to a subclass
        # output. The buggy releases turn it into a FakeScriptObject constant
        # of the AOT graph: Python gets that object on a cold compile (2.12,
        # 2.13) and None once the FX graph cache serves the graph (all three).
        from torch._inductor import utils as inductor_utils

        fresh_cache = getattr(inductor_utils, "fresh_cache", None) or (
            inductor_utils.fresh_inductor_cache
        )

        def f(x):
            cfg = QuantConfig("fp8")
            return MetaTensor(x, cfg) + 1, cfg

        with fresh_cache():
            for run in ("cold", "fx-graph-cache hit"):
                torch._dynamo.reset()
                out, cfg = torch.compile(f, backend="inductor", fullgraph=True)(
                    torch.ones(3)
                )
                self.assertIs(type(cfg), QuantConfig, run)
                self.assertEqual(cfg, QuantConfig("fp8"))
                self.assertIsInstance(out, MetaTensor)
                self.assertEqual(out._data, torch.full((3,), 2.0))
                self.assertEqual(out._meta, QuantConfig("fp8"))

    @harness.upstream_bug(
        "PR 188799 (issue 188796)", broken_on=("2.11.0", "2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1"),
        fails_with=(torch._dynamo.exc.Unsupported,),
        # 2.14.0 breaks a step earlier, on y._meta itself (python_type())
        match=r"Unsupported method call.*get_num_buffers"
        r"|GetAttrVariable\(TensorVariable\(\), _meta\) does not implement python_type",
    )
    @harness.needs_opaque_members
    @harness.needs_value_opaque_members
    def test_tensor_subclass_with_callable_opaque_attr(self):
        # Calling a method of a callable value opaque read off an
        # intermediate subclass (no source) graph-broke: only non-callable
        # metadata was accepted there.
        def f(x):
            y = x * 2
            return y._data * y._meta.get_num_buffers()

        x = MetaTensor(torch.ones(3), Quantizer(3))
        out = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
        self.assertEqual(out, torch.full((3,), 6.0))

    @harness.needs_opaque_members
    @harness.needs_value_opaque_members
    def test_non_callable_value_opaque_attr_still_works(self):
        # The control case of the one above: every release handles it, and
        # the fix must not change it.
        def f(x):
            y = x * 2
            return y._data * len(y._meta.tag)

        x = MetaTensor(torch.ones(3), QuantConfig("abcd"))
        out = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
        self.assertEqual(out, torch.full((3,), 8.0))

    @unittest.skipUnless(NATIVE, "torch.export of value opaques needs torch >= 2.12")
    @harness.upstream_bug(
        "issue 179870 (open; PR 181676 unmerged)",
        broken_on=("2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1"),
        fails_with=(RuntimeError,),
        # 2.12.1 cannot serialize the argument; 2.13.0/2.14.1 cannot load it
        match=(
            r"Unsupported argument type: <class '[\w.]*QuantConfig'> with schema arg_type PyObject"
            r"|error when deserializing the saved file"
        ),
    )
    def test_export_save_load_opaque_constant(self):
        # A value opaque baked into an exported program, a literal argument
        # of a custom op (not in ep.constants): 2.12.1 cannot save it
        # (SerializeError), 2.13.0/2.14.1 save a custom-object argument
        # without its value and fail to load (KeyError in the deserializer).
        ep = torch.export.export(ScaleByConfig(), (torch.ones(3),))
        (original,) = _opaque_args(ep)
        expected = ep.module()(torch.ones(3))
        self.assertEqual(expected, torch.full((3,), 4.0))

        buf = io.BytesIO()
        torch.export.save(ep, buf)
        buf.seek(0)
        loaded = {"buffer": torch.export.load(buf)}
        with tempfile.TemporaryDirectory() as d:
            torch.export.save(ep, os.path.join(d, "program.pt2"))
            loaded["file"] = torch.export.load(os.path.join(d, "program.pt2"))
            # a loaded program saves again: the object is a graph literal
            # there too, not also an entry of its constants
            torch.export.save(loaded["file"], os.path.join(d, "again.pt2"))
            loaded["saved again"] = torch.export.load(os.path.join(d, "again.pt2"))

        for how, prog in loaded.items():
            self.assertEqual(prog.module()(torch.ones(3)), expected, how)
            (cfg,) = _opaque_args(prog)
            # type(): a FakeScriptObject passes isinstance checks
            self.assertIs(type(cfg), QuantConfig, how)
            self.assertTrue(cfg == original, how)  # a value opaque: equal, a copy
            self.assertEqual(dict(prog.constants), dict(ep.constants), how)

    @unittest.skipUnless(NATIVE, "torch.export of value opaques needs torch >= 2.12")
    def test_export_archive_of_opaque_constant_needs_install_to_load(self):
        # The format of the fix: a loader without it (the release's own
        # _load_exported_programs) refuses the archive at its constants
        # table, naming the record kind, instead of loading a graph whose
        # argument is missing.
        from torch.export.pt2_archive import _package

        stock_load = _release_function(self, _package._load_exported_programs, "export._load_exported_programs.opaque_constant")
        buf = io.BytesIO()
        torch.export.save(torch.export.export(ScaleByConfig(), (torch.ones(3),)), buf)
        with mock.patch.object(_package, "_load_exported_programs", stock_load):
            with self.assertRaisesRegex(
                RuntimeError, "Unsupported constant type: torch_subclass_rt_opaque_value_0"
            ):
                _package.load_pt2(io.BytesIO(buf.getvalue()))
            with self.assertLogs("torch.export", "WARNING"), self.assertRaisesRegex(
                RuntimeError, "error when deserializing"
            ):
                torch.export.load(io.BytesIO(buf.getvalue()))
        # with the fix, the same bytes load
        self.assertEqual(
            torch.export.load(io.BytesIO(buf.getvalue())).module()(torch.ones(3)),
            torch.full((3,), 4.0),
        )

    @unittest.skipUnless(NATIVE, "torch.export of value opaques needs torch >= 2.12")
    def test_export_archive_without_opaque_constant_unchanged(self):
        # A program without a value opaque argument (a parameter, a buffer,
        # a tensor constant) is written by the fix exactly as by the
        # release: same records, same order, same bytes.
        from torch.export.pt2_archive import _package

        stock_save = _release_function(self, _package._package_exported_programs, "export._package_exported_programs.opaque_constant")

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(3, 3)
                self.register_buffer("b", torch.ones(3))
                self.c = torch.arange(3.0)

            def forward(self, x):
                return self.lin(x) + self.b + self.c

        ep = torch.export.export(M(), (torch.ones(2, 3),))
        self.assertTrue(ep.constants)

        def records():
            buf = io.BytesIO()
            torch.export.save(ep, buf)
            archive = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
            return [(name, archive.read(name)) for name in archive.namelist()]

        ours = records()
        with mock.patch.object(_package, "_package_exported_programs", stock_save):
            stock = records()
        self.assertEqual([n for n, _ in ours], [n for n, _ in stock])
        self.assertEqual(ours, stock)

    @unittest.skipUnless(NATIVE, "torch.export of opaques needs torch >= 2.12")
    def test_export_save_reference_opaque_not_carried(self):
        # Reference-type opaques are outside the issue 179870 fix (identity
        # matters: a stored copy is another object); this records what each
        # release does with them, in every mode (no point changes it).
        from torch._export.serde.serialize import SerializeError

        # a program input: no release serializes its placeholder
        ep = torch.export.export(UseHandleInput(), (torch.ones(3), Handle(2)))
        with self.assertRaisesRegex(SerializeError, "Failed serializing node h"):
            torch.export.save(ep, io.BytesIO())

        # a module attribute: export lifts it into ep.constants
        ep = torch.export.export(UseHandleAttr(), (torch.ones(3),))
        (handle,) = ep.constants.values()
        self.assertIs(type(handle), Handle)
        buf = io.BytesIO()
        if harness.torch_major_minor() < (2, 13):
            # 2.12: the archive writer knows tensors and ScriptObjects only
            with self.assertRaisesRegex(RuntimeError, "Unsupported constant type"):
                torch.export.save(ep, buf)
            return
        # 2.13+: the release pickles it (its own record kind); what loads
        # is a copy, another object
        torch.export.save(ep, buf)
        buf.seek(0)
        loaded = torch.export.load(buf)
        (copy,) = loaded.constants.values()
        self.assertIs(type(copy), Handle)
        self.assertIsNot(copy, handle)
        self.assertEqual(loaded.module()(torch.ones(3)), torch.full((3,), 3.0))


if NATIVE:  # a value opaque in a custom op's schema: torch >= 2.12

    @torch.library.custom_op("tsrt_fixes_test::scale", mutates_args=())
    def _scale(x: torch.Tensor, cfg: QuantConfig) -> torch.Tensor:
        return x * len(cfg.tag)

    @_scale.register_fake
    def _(x, cfg):
        return torch.empty_like(x)

    @torch.library.custom_op("tsrt_fixes_test::use_handle", mutates_args=())
    def _use_handle(x: torch.Tensor, h: Handle) -> torch.Tensor:
        return x * h.n

    @_use_handle.register_fake
    def _(x, h):
        return torch.empty_like(x)

    class ScaleByConfig(torch.nn.Module):
        """A value opaque attribute passed to a custom op: export keeps it
        in the graph as a literal argument."""

        def __init__(self):
            super().__init__()
            self.cfg = QuantConfig("int4")

        def forward(self, x):
            return torch.ops.tsrt_fixes_test.scale(x, self.cfg)

    class UseHandleAttr(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.h = Handle(3)

        def forward(self, x):
            return torch.ops.tsrt_fixes_test.use_handle(x, self.h)

    class UseHandleInput(torch.nn.Module):
        def forward(self, x, h):
            return torch.ops.tsrt_fixes_test.use_handle(x, h)


def _opaque_args(ep):
    """The QuantConfig objects the graph of ``ep`` passes to its nodes."""
    return [
        a
        for n in ep.graph.nodes
        for a in pytree.tree_leaves((n.args, n.kwargs))
        if isinstance(a, QuantConfig)
    ]


class TestUpstreamFixesCUDA(TestCase):
    @unittest.skipUnless(
        torch.cuda.is_available(),
        "CUDA graphs (mode='reduce-overhead') need a CUDA device; none here",
    )
    def test_opaque_input_through_cudagraph_trees(self):
        # A reference opaque (the mesh handle, a graph input next to the
        # local tensor) in the CUDA-graph tree pipeline (upstream PR 179793:
        # stock 2.11 refused such a graph, "non-Tensor inputs", or copied
        # the opaque like a tensor). It was recorded as that bug on 2.11
        # until run on a GPU: with install() on torch 2.11.0 (H200) it
        # passes, so it is a plain test, on every torch with a GPU.
        from torch._dynamo.utils import counters

        from torch_subclass_rt.examples.mesh_tensor import MeshHandle, MeshTensor

        counters.clear()
        f = torch.compile(lambda x: x.sin() + 1, mode="reduce-overhead", fullgraph=True)
        for name in ("a", "b", "c"):
            mesh = MeshHandle(name)
            local = torch.randn(8, device="cuda")
            out = f(MeshTensor(local, mesh))
            self.assertIs(out.mesh, mesh)
            self.assertEqual(out._local, local.sin() + 1)
        self.assertEqual(counters["inductor"]["cudagraph_skips"], 0)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
