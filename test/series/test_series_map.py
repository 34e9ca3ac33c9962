"""The map between the patch points and the patch series (tools/series_map.py).

Every change the series makes to torch must be covered by a point (or be
listed with the reason it needs none), and every point that changes
behaviour must name the series changes it stands for. The checker is tested
on synthetic series and points first (any torch), then on the real ones:
the real map must be clean, and adding a point or a hunk alone to it must be
reported (torch 2.10.0 and 2.11.0 only: a series is applied to the sources
of the torch it is written against). Every series numbers its patches as
the newest does (Note [One numbering for every series]).
"""

from __future__ import annotations

import ast
import difflib
import sys
import textwrap
import unittest
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools import _common, series_map  # noqa: E402
from torch_subclass_rt.patching.registry import PatchPoint  # noqa: E402

#: the series of the running torch (patches/v2.10.0 or patches/v2.11.0)
SERIES_VERSION = _common.normalize_version(torch.__version__)
needs_series_torch = unittest.skipUnless(
    SERIES_VERSION in series_map.series_versions(),
    f"the map is computed on the torch sources a series is written against "
    f"({', '.join(series_map.series_versions())}; this is torch {torch.__version__})",
)


def make_patch(path: str, before: str, after: str, new_file: bool = False) -> str:
    """A git-style diff of one file (what format-patch writes, less the mail)."""
    diff = difflib.unified_diff(
        before.splitlines(), after.splitlines(),
        "/dev/null" if new_file else f"a/{path}", f"b/{path}", lineterm="",
    )
    return f"diff --git a/{path} b/{path}\n" + "\n".join(diff) + "\n"


@dataclass
class FakePoint:
    """What series_map.check reads of a PatchPoint."""

    name: str
    series: tuple[str, ...] = ()
    series_none: str = ""
    speed_only: str = ""
    group: str = ""
    versions: frozenset = frozenset({"9.9.0"})


ORIGINAL = textwrap.dedent(
    '''\
    import os


    def f(x):
        return x + 1


    class C:
        limit = 3

        def m(self, x):
            # a comment
            return x


    def untouched():
        return 0
    '''
)


class TestChanges(unittest.TestCase):
    """Lines of a patch -> the units they change."""

    def changes(self, after: str, before: str = ORIGINAL) -> list[str]:
        patch = make_patch("torch/mod.py", before, after)
        found = series_map.series_changes([("0001", patch)], lambda p: before)
        return [c.entry + (" (new)" if c.new else "") for c in found]

    def test_function_method_and_class_level(self) -> None:
        after = (
            ORIGINAL.replace("return x + 1", "return x + 2")
            .replace("limit = 3", "limit = 4")
            .replace("# a comment", "# another comment")
        )
        self.assertEqual(
            self.changes(after),
            ["0001 torch/mod.py::C", "0001 torch/mod.py::C.m", "0001 torch/mod.py::f"],
        )

    def test_new_helper_and_new_method(self) -> None:
        after = ORIGINAL.replace(
            "class C:", "def helper():\n    return 1\n\n\nclass C:"
        ).replace("    def m(self", "    def n(self):\n        return 2\n\n    def m(self")
        self.assertEqual(
            self.changes(after),
            ["0001 torch/mod.py::C.n (new)", "0001 torch/mod.py::helper (new)"],
        )

    def test_imports_serve_the_changes_of_the_same_patch(self) -> None:
        after = ORIGINAL.replace("import os", "import os\nimport sys").replace(
            "return x + 1", "return sys.maxsize"
        )
        self.assertEqual(self.changes(after), ["0001 torch/mod.py::f"])
        # alone (a re-export), an import is a change of its own
        self.assertEqual(
            self.changes(ORIGINAL.replace("import os", "import os\nimport sys")),
            ["0001 torch/mod.py::<imports>"],
        )

    def test_layout_outside_functions_is_no_change(self) -> None:
        after = ORIGINAL.replace("class C:", "# Note [C]\n# says why\nclass C:")
        self.assertEqual(self.changes(after), [])

    def test_module_level_statements(self) -> None:
        after = ORIGINAL + "\n_TABLE = {}\nuntouched()\n"
        self.assertEqual(
            self.changes(after),
            ["0001 torch/mod.py::<module> (new)", "0001 torch/mod.py::_TABLE (new)"],
        )

    def test_later_patch_applies_to_the_earlier_result(self) -> None:
        first = ORIGINAL.replace("return x + 1", "return x + 2")
        second = first.replace("return 0", "return 1")
        patches = [
            ("0001", make_patch("torch/mod.py", ORIGINAL, first)),
            ("0002", make_patch("torch/mod.py", first, second)),
        ]
        found = series_map.series_changes(patches, lambda p: ORIGINAL)
        self.assertEqual(
            [c.entry for c in found],
            ["0001 torch/mod.py::f", "0002 torch/mod.py::untouched"],
        )

    def test_tests_and_new_files_outside_torch_are_not_mapped(self) -> None:
        patch = make_patch("test/test_x.py", "", "def test_x():\n    pass\n", new_file=True)
        self.assertEqual(series_map.series_changes([("0006", patch)], lambda p: None), [])

    def test_mismatching_source_is_refused(self) -> None:
        patch = make_patch("torch/mod.py", ORIGINAL, ORIGINAL.replace("x + 1", "x + 2"))
        with self.assertRaisesRegex(_common.ToolError, "does not match the patch"):
            series_map.series_changes(
                [("0001", patch)], lambda p: ORIGINAL.replace("x + 1", "x - 1")
            )


def _changes(*entries: str) -> list[series_map.Change]:
    out = []
    for e in entries:
        patch, path, unit = series_map.parse_entry(e)
        out.append(series_map.Change(patch, path, unit))
    return out


class TestCheck(unittest.TestCase):
    """Both directions of the map, on synthetic points and series."""

    F = "0001 torch/mod.py::f"
    G = "0001 torch/mod.py::g"

    def check(self, points, changes, without=None, **kw):
        return series_map.check(points, changes, without or {}, "9.9.0", **kw).problems

    def test_clean(self) -> None:
        pts = [FakePoint("p.f", series=(self.F,)), FakePoint("p.fast", speed_only="2x")]
        self.assertEqual(self.check(pts, _changes(self.F, self.G), {self.G: "types only"}), [])

    def test_point_without_series_counterpart(self) -> None:
        pts = [FakePoint("p.f", series=(self.F,)), FakePoint("p.g", series=(self.G,))]
        problems = self.check(pts, _changes(self.F))
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("point p.g: names '0001 torch/mod.py::g'", problems[0])
        self.assertIn("does not change", problems[0])

    def test_hunk_no_point_covers(self) -> None:
        pts = [FakePoint("p.f", series=(self.F,))]
        problems = self.check(pts, _changes(self.F, self.G))
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("series change '0001 torch/mod.py::g' is covered by no patch point",
                      problems[0])

    def test_point_naming_nothing(self) -> None:
        problems = self.check([FakePoint("p.f")], [])
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("point p.f: no series counterpart", problems[0])

    def test_series_none_refused_on_this_version(self) -> None:
        # no point that changes behaviour on a series' torch goes without its
        # patch: "not ported yet" is refused, grouped or not
        grouped = FakePoint("p.dt", series_none="not yet", group="dt")
        ungrouped = FakePoint("p.y", series_none="not yet")
        problems = self.check([grouped, ungrouped], [])
        self.assertEqual(len(problems), 2, problems)
        self.assertTrue(problems[0].startswith("point p.dt:"), problems)
        self.assertIn("port it into patches/v9.9.0", problems[0])
        self.assertTrue(problems[1].startswith("point p.y:"), problems)
        self.assertFalse(hasattr(series_map, "NOT_YET_IN_SERIES_POINTS"))
        self.assertFalse(hasattr(series_map, "NOT_YET_IN_SERIES_GROUPS"))
        # a point for other releases only (forced, native+fixes) may say why
        elsewhere = FakePoint("p.z", series_none="forced only", versions=frozenset({"1.0.0"}))
        self.assertEqual(self.check([elsewhere], []), [])

    def test_series_entries_on_a_point_for_other_releases(self) -> None:
        pt = FakePoint("p.f", series=(self.F,), versions=frozenset({"1.0.0"}))
        problems = self.check([pt], _changes(self.F))
        # the change is then claimed by no point, and the point's entries
        # belong to no series
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("applies to no torch release with a patch series", problems[0])
        self.assertIn("is covered by no patch point", problems[1])
        # a point of another release's series is that series' business
        other = FakePoint("p.g", series=(self.G,), versions=frozenset({"9.8.0"}))
        problems = self.check([FakePoint("p.f", series=(self.F,)), other], _changes(self.F),
                              series_versions=("9.8.0", "9.9.0"))
        self.assertEqual(problems, [])

    def test_left_out_patches(self) -> None:
        # a shared point names a change of a patch this series leaves out
        pt = FakePoint("p.f", series=(self.F, "0012 torch/mod.py::h"))
        self.assertEqual(
            len(self.check([pt], _changes(self.F))), 1,
            "an entry of a patch the series has must be found",
        )
        self.assertEqual(self.check([pt], _changes(self.F), left_out={"0012": "why"}), [])
        # ... and so may SERIES_WITHOUT_POINT
        self.assertEqual(
            self.check([FakePoint("p.f", series=(self.F,))], _changes(self.F),
                       {"0012 torch/mod.py::h": "types only"}, left_out={"0012": "why"}),
            [],
        )

    def test_stale_or_doubled_without_point_entries(self) -> None:
        pts = [FakePoint("p.f", series=(self.F,))]
        problems = self.check(pts, _changes(self.F), {self.F: "dup", self.G: "gone"})
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("also listed in SERIES_WITHOUT_POINT", problems[0])
        self.assertIn("lists '0001 torch/mod.py::g'", problems[1])


class TestPatchPointDeclaration(unittest.TestCase):
    """A point declares its series side as data (registry.PatchPoint)."""

    def point(self, **kw) -> PatchPoint:
        return PatchPoint(
            name="t.p", target="m:f", build=lambda o: o, versions=frozenset({"2.11.0"}),
            modes=frozenset({"backport"}), reason="test", **kw,
        )

    def test_exactly_one_of_series_series_none_speed_only(self) -> None:
        with self.assertRaisesRegex(ValueError, "declares none"):
            self.point()
        with self.assertRaisesRegex(ValueError, "declares exactly one"):
            self.point(speed_only="2x", series=("0001 torch/a.py::f",))
        with self.assertRaisesRegex(ValueError, "declares exactly one"):
            self.point(series_none="why", series=("0001 torch/a.py::f",))
        self.point(series=("0001 torch/a.py::f",))
        self.point(series_none="forced only")
        self.point(speed_only="2x")

    def test_entry_format(self) -> None:
        with self.assertRaisesRegex(ValueError, "NNNN torch/path.py::qualname"):
            self.point(series=("torch/a.py::f",))
        with self.assertRaisesRegex(ValueError, "not a string"):
            self.point(series="0001 torch/a.py::f")

    def test_status_shows_the_correspondence(self) -> None:
        pt = self.point(series=("0001 torch/a.py::f", "0001 torch/a.py::g", "0003 torch/b.py::h"))
        self.assertEqual(
            pt.series_summary(), "series 0001 torch/a.py::f, g; 0003 torch/b.py::h"
        )
        self.assertEqual(self.point(speed_only="1.35 -> 1.2").series_summary(),
                         "speed-only: 1.35 -> 1.2")


@needs_series_torch
class TestRealSeriesMap(unittest.TestCase):
    """The real points against the real series (patches/v2.11.0)."""

    @classmethod
    def setUpClass(cls) -> None:
        from torch_subclass_rt.points import SERIES_WITHOUT_POINT, all_points

        cls.points = all_points()
        cls.without = SERIES_WITHOUT_POINT
        cls.root = series_map.default_torch_root()
        cls.patches = series_map.read_series(_common.series_dir(SERIES_VERSION))
        cls.changes = series_map.series_changes(
            cls.patches, series_map.original_reader(cls.root)
        )

    def check(self, points, changes):
        return series_map.check(
            points, changes, self.without, SERIES_VERSION,
            series_versions=series_map.series_versions(),
            left_out=series_map.LEFT_OUT_OF_SERIES.get(SERIES_VERSION, {}),
        ).problems

    def test_map_is_clean_both_ways(self) -> None:
        problems = self.check(self.points, self.changes)
        self.assertEqual(problems, [], "\n".join(problems))
        # every behaviour-changing point of 2.11, grouped or not, is in the map
        claimed = {p.name for p in self.points if p.series}
        for p in self.points:
            if SERIES_VERSION in p.versions and not p.speed_only:
                self.assertIn(p.name, claimed)

    def test_a_point_added_alone_is_reported(self) -> None:
        extra = PatchPoint(
            name="new.point", target="torch.nn.utils.parametrize:register_parametrization",
            build=lambda o: o, versions=frozenset({SERIES_VERSION}),
            modes=frozenset({"backport"}), reason="test",
            series=("0004 torch/nn/utils/parametrize.py::register_parametrization",),
        )
        problems = self.check([*self.points, extra], self.changes)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("point new.point: names '0004 torch/nn/utils/parametrize.py"
                      "::register_parametrization'", problems[0])

    def test_a_hunk_added_alone_is_reported(self) -> None:
        # a patch on top of the series that changes a function of a file the
        # series does not touch, and adds a helper there
        path = "torch/_functorch/compilers.py"
        before = (self.root.parent / path).read_text()
        fn = next(n for n in ast.parse(before).body if isinstance(n, ast.FunctionDef))
        lines = before.splitlines()
        first = fn.body[0]
        lines.insert(first.lineno - 1, " " * first.col_offset + "_ = None")
        after = "\n".join(lines) + "\n\n\ndef _new_helper():\n    return 1\n"
        patches = [*self.patches, ("0014", make_patch(path, before, after))]
        changes = series_map.series_changes(patches, series_map.original_reader(self.root))
        problems = self.check(self.points, changes)
        self.assertEqual(len(problems), 2, problems)
        text = "\n".join(problems)
        self.assertIn(f"series change '0014 {path}::{fn.name}' is covered by no patch point",
                      text)
        self.assertIn(f"series change '0014 {path}::_new_helper' (new) is covered", text)

    def test_cli(self) -> None:
        import subprocess

        proc = subprocess.run(
            [sys.executable, str(REPO / "tools" / "series_map.py")],
            capture_output=True, text=True, cwd=REPO,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("0001 torch/_functorch/_aot_autograd/subclass_utils.py"
                      "::create_subclass_metadata\n    -> aot_autograd.create_subclass_metadata",
                      proc.stdout)
        self.assertIn("OK:", proc.stdout)



def _subjects(version: str) -> dict[str, str]:
    """Patch number -> subject ("[area] summary") of a series."""
    out = {}
    for patch in _common.series(_common.series_dir(version)):
        text = patch.read_text()
        head = text[text.index("Subject: "):text.index("\n\n", text.index("Subject: "))]
        subject = " ".join(head[len("Subject: "):].split())
        out[patch.name[:4]] = subject.split("] ", 1)[1] if subject.startswith("[PATCH") else subject
    return out


class TestOneNumbering(unittest.TestCase):
    """Note [One numbering for every series]: patch N of an older base's
    series is patch N of the newest series, ported; what it leaves out is
    declared (series_map.LEFT_OUT_OF_SERIES), and 0000 is what the older
    base lacks."""

    def test_series_line_up(self) -> None:
        versions = series_map.series_versions()
        newest = max(versions, key=_common.normalize_version)
        reference = _subjects(newest)
        self.assertNotIn("0000", reference)
        for version in versions:
            if version == newest:
                continue
            with self.subTest(series=version):
                subjects = _subjects(version)
                left_out = series_map.LEFT_OUT_OF_SERIES.get(version, {})
                self.assertEqual(
                    sorted(set(subjects) - {"0000"}),
                    sorted(set(reference) - set(left_out)),
                    f"v{version}: the patches of v{newest} it has, and the ones it "
                    "declares left out, must be all of them",
                )
                for number, subject in subjects.items():
                    if number != "0000":
                        self.assertEqual(subject, reference[number], f"v{version} patch {number}")

    def test_v2_10_leaves_out_the_callable_value_fix_and_dtensor(self) -> None:
        # patch 0000 gives torch 2.10 the opaque members (guard_fn,
        # members=) that DeviceMesh / ProcessGroup as opaques (0012, 0013)
        # and derived submeshes (0016, 0017) build on, so those are carried,
        # and so are the fakes of a mesh (0022); a real opaque returned
        # through AOTAutograd over Dynamo (0023) needs DTensor's 0014; 2.10
        # reads a value opaque's attributes already (0026)
        self.assertEqual(
            sorted(series_map.LEFT_OUT_OF_SERIES["2.10.0"]),
            ["0010", "0011", "0014", "0015", "0023", "0026"],
        )
        self.assertLessEqual({"0012", "0013", "0016", "0017", "0022"}, set(_subjects("2.10.0")))


if __name__ == "__main__":
    unittest.main()
