"""Edited torch functions (patching/source_edit.py) debug like torch's own.

* A traceback through an edited function shows the *edited* source lines
  (linecache), for a small function and for the real edited
  ``ShapeEnv.produce_guards_verbose``.
* What install() does to torch's source is kept for review:
  ``test/expected/source_edits/<point name>.diff`` is the unified diff of
  every source-edited point's function (torch's text first), checked on
  every torch/mode whose install() edits source; torch 2.10 has its own
  set in ``source_edits/v2.10/`` (its functions are not 2.11's text)
  (``EXPECTTEST_ACCEPT=1``
  rewrites the files and deletes those of points that no longer edit).
* Edited code reaches torch_subclass_rt one way only (``__tsrt__``), and a
  decorated target is refused instead of silently losing its decorator.
"""

from __future__ import annotations

import inspect
import linecache
import sys
import traceback
import unittest
from unittest import mock

import harness

import torch
from torch._dynamo.test_case import TestCase

import torch_subclass_rt as tsrt
from torch_subclass_rt.patching import registry
from torch_subclass_rt.patching.registry import PatchError
from torch_subclass_rt.patching.source_edit import (
    HELPERS_NAME,
    Edit,
    edited_function,
    edited_source_of,
)
from torch_subclass_rt.points import _edit_api, all_points

MODE = harness.current_mode()

#: torch 2.10's functions are not 2.11's text: its diffs are a set of their own
DIFF_DIR = harness.EXPECTED_DIR / "source_edits"
if harness.torch_major_minor() == (2, 10):
    DIFF_DIR = DIFF_DIR / "v2.10"


def format_exc_text(fn, *args):
    """The traceback text of ``fn(*args)``'s exception (assertRaises would
    drop the traceback)."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        return "".join(traceback.format_exception(e))
    raise AssertionError(f"{fn} did not raise")


# --- small functions to edit (they need real source: defined here) ---------


def _small(x, d):
    total = x + 1
    return total / d


def _identity_decorator(f):
    return f


_DEFAULT = object()


def _keyword_only(x, *, scale=_DEFAULT):
    return x, scale


@_identity_decorator
def _decorated(x):
    return x + 1


def _make_closure():
    offset = 10

    def _with_closure(x):
        y = x + offset
        return y

    return _with_closure


class TestEditMechanics(TestCase):
    def edit_small(self):
        return edited_function(
            _small,
            [Edit("total = x + 1", "total = x + 1\nassert total != 2, 'edited assert fired'")],
        )

    def test_traceback_shows_edited_line(self):
        fn = self.edit_small()
        text = format_exc_text(fn, 1, 1)
        self.assertIn("edited assert fired", text)
        self.assertIn(f"<torch_subclass_rt edit of {__name__}._small #", text)
        # the source line itself, as for any function loaded from a file
        self.assertIn("assert total != 2, 'edited assert fired'\n", text)

    def test_edited_source_and_inspect(self):
        fn = self.edit_small()
        record = edited_source_of(fn)
        self.assertEqual(record.target, f"{__name__}._small")
        self.assertEqual(record.original, inspect.getsource(_small))
        self.assertIn("assert total != 2", record.edited)
        self.assertIn("assert total != 2", inspect.getsource(fn))
        self.assertEqual(
            record.diff(),
            f"--- {__name__}._small (torch)\n"
            f"+++ {__name__}._small (edited by torch_subclass_rt)\n"
            "@@ -1,3 +1,4 @@\n"
            " def _small(x, d):\n"
            "     total = x + 1\n"
            "+    assert total != 2, 'edited assert fired'\n"
            "     return total / d\n",
        )
        self.assertFalse(hasattr(fn, "__wrapped_torch_original__"))

    def test_same_edit_one_linecache_entry(self):
        a, b = self.edit_small(), self.edit_small()
        self.assertEqual(a.__code__.co_filename, b.__code__.co_filename)
        linecache.checkcache()  # what every traceback does first
        self.assertIn(a.__code__.co_filename, linecache.cache)

    def test_closure_kept_and_helpers_bound_as_closure(self):
        fn = edited_function(
            _make_closure(),
            [Edit("y = x + offset", "y = x + offset if __tsrt__.is_opaque_attr(x) else -x")],
        )
        self.assertEqual(fn(2), -2)
        self.assertIn(HELPERS_NAME, fn.__code__.co_freevars)
        self.assertNotIn(HELPERS_NAME, fn.__globals__, "torch's module globals untouched")
        i = fn.__code__.co_freevars.index(HELPERS_NAME)
        self.assertIs(fn.__closure__[i].cell_contents, _edit_api)

    def test_keyword_added_by_an_edit_keeps_its_default(self):
        # library.register_opaque_type adds guard_fn=None, members=None
        # to torch 2.10's signature; the copy takes torch's own default
        # objects (scale is _DEFAULT itself, not a re-evaluated one) and the
        # added parameter keeps the default the edit gave it
        fn = edited_function(
            _keyword_only,
            [
                Edit("def _keyword_only(x, *, scale=_DEFAULT):", "def _keyword_only(x, *, scale=_DEFAULT, shift=3):"),
                Edit("return x, scale", "return x + shift, scale"),
            ],
        )
        self.assertEqual(fn(1), (4, _DEFAULT))
        self.assertEqual(fn(1, shift=0, scale=2), (1, 2))

    def test_decorated_target_refused(self):
        with self.assertRaisesRegex(PatchError, r"_decorated is decorated \(@_identity_decorator\)"):
            edited_function(_decorated, [Edit("return x + 1", "return x + 2")])

    def test_edit_must_use_tsrt(self):
        for new in (
            "from torch_subclass_rt.points._dynamo_opaque import is_opaque_attr\ntotal = x + 1",
            "total = __import__('torch_subclass_rt').x + 1",
        ):
            with self.assertRaisesRegex(PatchError, r"only as __tsrt__\.<name>"):
                edited_function(_small, [Edit("total = x + 1", new)])
        with self.assertRaisesRegex(PatchError, r"__tsrt__\.no_such_helper, which"):
            edited_function(_small, [Edit("total = x + 1", "total = __tsrt__.no_such_helper(x)")])


def _edited_replacements() -> dict[str, object]:
    """point name -> EditedSource, for every point install() applies in the
    mode under test (all opt-in groups included), built from pristine torch."""
    st = tsrt.status()
    points = all_points()
    groups = {p.group for p in points if p.group}
    tsrt.uninstall()
    try:
        plans = registry.plan(registry.select(points, st.torch_version, st.mode, groups))
    finally:
        harness.restore_mode()
    out = {}
    for p in plans:
        record = edited_source_of(p.replacement)
        if record is not None:
            out[p.point.name] = record
    return out


@unittest.skipIf(MODE in ("native", "patched"), "nothing is installed in this mode")
class TestSourceEditDiffs(TestCase):
    def test_diffs_match_expected(self):
        edits = _edited_replacements()
        if not edits:
            self.skipTest(f"install() edits no torch source in mode {MODE}")
        produced = {f"{name}.diff": rec.diff() for name, rec in edits.items()}
        existing = {p.name for p in DIFF_DIR.glob("*.diff")} if DIFF_DIR.is_dir() else set()
        if harness._accepting():
            DIFF_DIR.mkdir(parents=True, exist_ok=True)
            for fname, text in produced.items():
                path = DIFF_DIR / fname
                if not (path.exists() and path.read_text() == text):
                    path.write_text(text)
            for stale in existing - set(produced):
                (DIFF_DIR / stale).unlink()
            return
        problems = []
        for fname, text in sorted(produced.items()):
            path = DIFF_DIR / fname
            if not path.exists():
                problems.append(f"missing {path.relative_to(harness.EXPECTED_DIR.parent)}")
                continue
            if path.read_text() != text:
                problems.append(harness.expected_first_diff(path, path.read_text(), text))
        for stale in sorted(existing - set(produced)):
            problems.append(
                f"{(DIFF_DIR / stale).relative_to(harness.EXPECTED_DIR.parent)}: no point "
                "edits this source any more"
            )
        if problems:
            self.fail(
                "source edits differ from test/expected/source_edits "
                "(EXPECTTEST_ACCEPT=1 rewrites them; review the result):\n"
                + "\n".join(problems)
            )

    def test_reinstall_adds_no_linecache_entries(self):
        def entries():
            return {k for k in linecache.cache if k.startswith("<torch_subclass_rt edit of ")}

        before = entries()
        if not before:
            self.skipTest(f"install() edits no torch source in mode {MODE}")
        tsrt.uninstall()
        self.assertEqual(entries(), before, "uninstall() leaves the text (nothing to undo)")
        harness.restore_mode()
        self.assertEqual(entries(), before, "the same edits reuse their entries")

    def test_edited_text_reaches_package_only_through_tsrt(self):
        edits = _edited_replacements()
        if not edits:
            self.skipTest(f"install() edits no torch source in mode {MODE}")
        for name, rec in edits.items():
            self.assertNotIn("torch_subclass_rt", rec.edited, name)
            self.assertNotIn("__import__(", rec.edited, name)


@unittest.skipIf(MODE != "backport", "produce_guards_verbose is edited on torch 2.11 only")
class TestProduceGuardsTraceback(TestCase):
    def test_error_in_edited_produce_guards_shows_edited_line(self):
        from torch_subclass_rt.examples.mesh_tensor import MeshHandle, MeshTensor

        real = _edit_api.is_opaque_attr

        class Boom(Exception):
            pass

        def is_opaque_attr(inner):
            # only from the edited produce_guards_verbose; the other edited
            # functions that call it (_automatic_dynamic, ...) run before
            if sys._getframe(1).f_code.co_name == "produce_guards_verbose":
                raise Boom("raised inside the edited produce_guards_verbose")
            return real(inner)

        torch._dynamo.reset()
        fn = torch.compile(lambda x: x.sin(), backend="eager", fullgraph=True)
        with mock.patch.object(_edit_api, "is_opaque_attr", is_opaque_attr):
            text = format_exc_text(fn, MeshTensor(torch.randn(3), MeshHandle()))
        torch._dynamo.reset()
        self.assertIn("raised inside the edited produce_guards_verbose", text)
        self.assertIn(
            "<torch_subclass_rt edit of "
            "torch.fx.experimental.symbolic_shapes.ShapeEnv.produce_guards_verbose #",
            text,
        )
        self.assertIn("if __tsrt__.is_opaque_attr(inner_t):\n", text)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
