"""Upstream issue 179870 (PR 181676 unmerged; points/export_opaque_constants.py):
``torch.export`` saves and loads a value opaque passed to a graph node as a
literal argument, writing programs without one exactly as the release does.
Reference-type opaques are outside the fix; what each release does with
them is recorded here too.

The fix test is marked :func:`harness.upstream_bug`: in mode ``native`` on a
release that has the bug it must fail (xfail); with ``install()`` or the
patch series it must pass (points/__init__.py, Note [Upstream fixes]).
"""

from __future__ import annotations

import io
import os
import tempfile
import unittest
import zipfile
from unittest import mock

import harness
from fixtures import Handle, QuantConfig
import fixtures

import torch
import torch.utils._pytree as pytree
from torch._dynamo.test_case import TestCase

import torch_subclass_rt as tsrt

fixtures.register_context_opaques()
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


class TestExportOpaqueConstants(TestCase):
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

    @torch.library.custom_op("tsrt_export_test::scale", mutates_args=())
    def _scale(x: torch.Tensor, cfg: QuantConfig) -> torch.Tensor:
        return x * len(cfg.tag)

    @_scale.register_fake
    def _(x, cfg):
        return torch.empty_like(x)

    @torch.library.custom_op("tsrt_export_test::use_handle", mutates_args=())
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
            return torch.ops.tsrt_export_test.scale(x, self.cfg)

    class UseHandleAttr(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.h = Handle(3)

        def forward(self, x):
            return torch.ops.tsrt_export_test.use_handle(x, self.h)

    class UseHandleInput(torch.nn.Module):
        def forward(self, x, h):
            return torch.ops.tsrt_export_test.use_handle(x, h)


def _opaque_args(ep):
    """The QuantConfig objects the graph of ``ep`` passes to its nodes."""
    return [
        a
        for n in ep.graph.nodes
        for a in pytree.tree_leaves((n.args, n.kwargs))
        if isinstance(a, QuantConfig)
    ]

if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
