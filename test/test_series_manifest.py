"""Our test cases and the patch series' in-tree tests are one list.

The series (``patches/v<version>/``) adds test files to torch's tree (0006
test_opaque_subclass_attrs.py, 0009 ..._parity.py, ...): a copy of our cases
for a patched torch. Nothing kept the copies in step. Here every test
function of a series test file is in our file of the same name
(``test_opaque_subclass_fixes.py`` is our ``test_upstream_fixes.py``) and
every test of ours is in each series that has the file, or the pair is
listed below with why it is not.

Entries marked ``UNREVIEWED`` were listed when this test was introduced and
still need their reason written (or the copies brought in step); a new
divergence, or an entry no series needs any more, fails.
"""

from __future__ import annotations

import ast
import re
import unittest
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERIES = sorted(p.name for p in (ROOT / "patches").iterdir() if p.is_dir())
#: a series test file whose counterpart here has another name
OURS = {"test/test_opaque_subclass_fixes.py": "test/test_upstream_fixes.py"}

UNREVIEWED = "UNREVIEWED: listed when the manifest test was introduced; reason to be written"
_UPSTREAM_NATIVE = (
    "records an upstream bug of torch >= 2.12 (skipped below 2.12: the feature it "
    "needs is 2.12's, which the series does not backport)"
)
_VALUE_OUTPUTS = (
    "value opaques as graph outputs are torch 2.12's (PR 177560), not the subclass "
    "feature the series backports"
)

#: (series file, test) -> why the test is ours only (in no series, or not
#: in one of them: a v2.10.0 series lacks some of v2.11.0's)
ONLY_OURS: dict[tuple[str, str], str] = {
    ("test/test_device_mesh_derived_submesh.py", "test_mesh_classes_have_one_and_others_none"): UNREVIEWED,
    ("test/test_device_mesh_derived_submesh.py", "test_unhashable_class"): UNREVIEWED,
    ("test/test_device_mesh_opaque.py", "test_equal_meshes_one_compile_runtime_mesh_aot_eager"): UNREVIEWED,
    ("test/test_device_mesh_opaque.py", "test_member_reads_in_dynamo"): UNREVIEWED,
    ("test/test_device_mesh_opaque.py", "test_process_group_in_attrs_inductor"): UNREVIEWED,
    ("test/test_device_mesh_opaque.py", "test_unregistered_member_in_dynamo"): UNREVIEWED,
    ("test/test_dtensor_opaque_mesh.py", "test_fakes_of_one_object_tracked_apart"): UNREVIEWED,
    ("test/test_dtensor_opaque_mesh.py", "test_install_without_dtensor_leaves_flatten"): (
        "checks install()'s dtensor opt-in, which a patched torch does not have"
    ),
    ("test/test_dtensor_opaque_mesh.py", "test_redistribute_own_mesh_aot_eager"): (
        "the series' test_redistribute_own_mesh, run here once per backend"
    ),
    ("test/test_dtensor_opaque_mesh.py", "test_redistribute_own_mesh_inductor"): (
        "the series' test_redistribute_own_mesh, run here once per backend"
    ),
    ("test/test_opaque_subclass_attrs.py", "test_compiled_autograd_refused_on_torch_2_10"): UNREVIEWED,
    ("test/test_opaque_subclass_fixes.py", "test_export_archive_of_opaque_constant_needs_install_to_load"): _UPSTREAM_NATIVE,
    ("test/test_opaque_subclass_fixes.py", "test_export_archive_without_opaque_constant_unchanged"): _UPSTREAM_NATIVE,
    ("test/test_opaque_subclass_fixes.py", "test_export_save_load_opaque_constant"): _UPSTREAM_NATIVE,
    ("test/test_opaque_subclass_fixes.py", "test_export_save_reference_opaque_not_carried"): _UPSTREAM_NATIVE,
    ("test/test_opaque_subclass_fixes.py", "test_non_callable_value_opaque_attr_still_works"): UNREVIEWED,
    ("test/test_opaque_subclass_fixes.py", "test_opaque_constant_with_subclass_output_cache_hit"): _UPSTREAM_NATIVE,
    ("test/test_opaque_subclass_fixes.py", "test_opaque_input_through_cudagraph_trees"): (
        "needs a GPU: no GPU run of a patched torch has checked the series with it "
        "(with install() it passes on torch 2.11.0, seen on an H200)"
    ),
    ("test/test_opaque_subclass_fixes.py", "test_value_type_graph_output_subclass_metadata_side_effect"): _UPSTREAM_NATIVE,
    ("test/test_opaque_subclass_parity.py", "test_benchmark_harness_no_pickle_for_opaque_inputs"): UNREVIEWED,
    ("test/test_opaque_subclass_parity.py", "test_broken_sharing_after_cache_hit_inductor"): UNREVIEWED,
    ("test/test_opaque_subclass_parity.py", "test_getitem"): UNREVIEWED,
    ("test/test_opaque_subclass_parity.py", "test_opaque_constant_output_with_subclass_output_backend_aot_eager"): UNREVIEWED,
    ("test/test_opaque_subclass_parity.py", "test_opaque_constant_output_with_subclass_output_backend_inductor"): UNREVIEWED,
    ("test/test_opaque_subclass_parity.py", "test_subclass_opaque_output_reuses_input_proxy"): UNREVIEWED,
    ("test/test_opaque_subclass_parity.py", "test_tensor_subclass_with_opaque_attr"): UNREVIEWED,
    ("test/test_opaque_subclass_parity.py", "test_value_type_graph_output_backend_aot_eager"): _VALUE_OUTPUTS,
    ("test/test_opaque_subclass_parity.py", "test_value_type_graph_output_backend_eager"): _VALUE_OUTPUTS,
    ("test/test_opaque_subclass_parity.py", "test_value_type_graph_output_backend_inductor"): _VALUE_OUTPUTS,
    ("test/test_opaque_subclass_parity.py", "test_value_type_graph_output_capture_for_export"): _VALUE_OUTPUTS,
    ("test/test_opaque_subclass_parity.py", "test_value_type_opaque_unregistered_member_is_not_a_subclass_error"): UNREVIEWED,
    ("test/test_opaque_subclass_parity.py", "test_value_type_subclass"): UNREVIEWED,
}

#: (series file, test) -> why a series test is not ours
ONLY_SERIES: dict[tuple[str, str], str] = {
    ("test/test_dtensor_opaque_mesh.py", "test_redistribute_own_mesh"): (
        "ours runs it once per backend (test_redistribute_own_mesh_aot_eager, _inductor)"
    ),
    ("test/test_opaque_subclass_attrs.py", "test_unpicklable_reference_opaque_fx_graph_cache"): UNREVIEWED,
    ("test/test_opaque_subclass_fixes.py", "test_tensor_subclass_with_non_callable_opaque_attr"): UNREVIEWED,
}

_DEF = re.compile(r"^([+-])\s*(?:def (test_\w+)\(|(test_\w+)\s*=)")


def series_tests(series: str) -> dict[str, set[str]]:
    """test file -> the test functions the series' patches leave in it
    (added lines minus removed ones, patch by patch)."""
    files: dict[str, set[str]] = defaultdict(set)
    for patch in sorted((ROOT / "patches" / series).glob("*.patch")):
        target = None
        for line in patch.read_text().splitlines():
            if line.startswith("+++ "):
                target = line[len("+++ b/"):] if line.startswith("+++ b/test/") else None
                continue
            m = _DEF.match(line) if target else None
            if m:
                name = m.group(2) or m.group(3)
                (files[target].add if m.group(1) == "+" else files[target].discard)(name)
    return dict(files)


def our_tests(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name) and t.id.startswith("test_"))
    return names


def divergences() -> tuple[set, set]:
    """((file, test) of ours missing from a series, (file, test) of a series
    missing from ours)."""
    only_ours, only_series = set(), set()
    for series in SERIES:
        for file, theirs in series_tests(series).items():
            ours = our_tests(ROOT / OURS.get(file, file))
            only_ours |= {(file, t) for t in ours - theirs}
            only_series |= {(file, t) for t in theirs - ours}
    return only_ours, only_series


class TestSeriesManifest(unittest.TestCase):
    def test_series_have_test_files(self):
        self.assertTrue(SERIES)
        for series in SERIES:
            files = series_tests(series)
            self.assertIn("test/test_opaque_subclass_attrs.py", files, series)
            for file in files:
                self.assertTrue((ROOT / OURS.get(file, file)).is_file(), f"{series}: {file} is not ours")

    def test_every_case_in_ours_and_each_series_or_listed(self):
        only_ours, only_series = divergences()
        problems = [
            f"{f}::{t}: ours, in no series (or not in one) and not in ONLY_OURS"
            for f, t in sorted(only_ours - ONLY_OURS.keys())
        ] + [
            f"{f}::{t}: in a series, not ours, and not in ONLY_SERIES"
            for f, t in sorted(only_series - ONLY_SERIES.keys())
        ] + [
            f"{f}::{t}: listed in ONLY_OURS but every series has it now"
            for f, t in sorted(ONLY_OURS.keys() - only_ours)
        ] + [
            f"{f}::{t}: listed in ONLY_SERIES but ours has it now"
            for f, t in sorted(ONLY_SERIES.keys() - only_series)
        ]
        self.assertFalse(problems, "\n".join(problems))

    def test_series_parser(self):
        # the reading of a patch: additions minus removals, per target file
        import tempfile
        from unittest import mock

        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "patches" / "v9.9.0"
            p.mkdir(parents=True)
            (p / "0001-a.patch").write_text(
                "+++ b/test/test_a.py\n+    def test_x(self):\n+    def test_y(self):\n"
                "+++ b/torch/f.py\n+def test_not_a_test_file():\n"
            )
            (p / "0002-b.patch").write_text("+++ b/test/test_a.py\n-    def test_y(self):\n+test_z = f\n")
            with mock.patch(f"{__name__}.ROOT", Path(d)):
                self.assertEqual(series_tests("v9.9.0"), {"test/test_a.py": {"test_x", "test_z"}})


if __name__ == "__main__":
    unittest.main()
