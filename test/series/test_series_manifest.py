"""Our test cases and the patch series' in-tree tests are one list.

The series (``patches/v<version>/``) adds test files to torch's tree (0006
test_opaque_subclass_attrs.py, 0009 ..._parity.py, ...): a copy of our cases
for a patched torch. Nothing kept the copies in step. Here every test
function of a series test file is in our file of the same name
(``test_opaque_subclass_fixes.py`` is our ``test_callable_value_opaque.py``) and
every test of ours is in each series that has the file, or the pair is
listed below with why it is not.

Every listed pair carries its reason per series (a case one series lacks
is not excused in the others), and a reason is a sentence that says why,
not a placeholder (``test_every_reason_is_written``); a new divergence, or an
entry no series needs any more, fails.
"""

from __future__ import annotations

import ast
import re
import unittest
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the backport series. patches/upstream/ is not a copy of our cases: it is
#: what upstream main lacks, with tests written for upstream's review (its
#: issue 179870 commit refuses to save what our point saves), and
#: tools/verify_patches.py --series upstream runs them in-tree
SERIES = sorted(p.name for p in (ROOT / "patches").iterdir() if p.is_dir() and p.name != "upstream")
#: a series test file whose counterpart here has another name
OURS = {
    "test/test_opaque_subclass_fixes.py": "test_callable_value_opaque.py",
    "test/test_opaque_subclass_user_written.py": "test_lazy_log_and_donated_buffers.py",
    "test/test_opaque_lazy_members.py": "test_lazy_members.py",
    "test/test_aot_metadata_repr_subclass.py": "test_no_subclass_data_repr.py",
    "test/test_aot_donated_buffer_subclass_mutation.py": "test_donated_buffers_split.py",
    "test/test_aot_saved_strides_subclass_mutation.py": "test_saved_activation_strides.py",
    "test/test_opaque_value_type_attrs.py": "test_value_opaque_attrs.py",
    "test/test_aot_tangent_mismatch_opaque.py": "test_tangent_mismatch_message.py",
}


def our_file(series_file: str) -> Path:
    """Our counterpart of a series test file (``test/<name>``, the path in
    torch's tree): the test file of that name (or the name :data:`OURS`
    gives) in whichever folder of test/ it is; the path of the
    missing file in test/ where there is none."""
    name = OURS.get(series_file, Path(series_file).name)
    found = sorted((ROOT / "test").rglob(name))
    return found[0] if found else ROOT / "test" / name


def _has_file(series: str, file: str) -> bool:
    return any(
        f"+++ b/{file}\n" in patch.read_text()
        for patch in (ROOT / "patches" / series).glob("*.patch")
    )


def _listed(file: str, reasons: dict[str, str], series: tuple[str, ...] | None = None):
    """{(series, file, test): reason} for each test of ``reasons`` in each
    of ``series`` (default: every series with ``file``)."""
    where = series if series is not None else [s for s in SERIES if _has_file(s, file)]
    return {(s, file, test): why for s in where for test, why in reasons.items()}


V2_10, V2_11 = ("v2.10.0",), ("v2.11.0",)
_VALUE_OUTPUTS = (
    "value opaques as graph outputs are torch 2.12's (PR 177560), not the subclass "
    "feature the series backports"
)
_OPAQUE_CONSTANT_OUTPUT = (
    "not yet ported: a value opaque built in a module's forward and returned next to "
    "the subclass output of an autograd graph (a parameter, an input requiring grad) "
    "goes through 0008's returned-constant change and 0001's subclass outputs; 0009's "
    "test_return_value_opaque_constant returns one without grad, and the in-tree copy "
    "lacks the nn.Module with a Parameter and the requires_grad input"
)
_RECONSTRUCT_FN = (
    "a unit test of our lookup helper points._derived_submesh.reconstruct_fn (a per-class "
    "lru_cache answering for DeviceMesh and its subclasses by issubclass, uncached for an "
    "unhashable class); 0016 has no such helper: its get_reconstruct_fn reads the exact "
    "class's registration in _OPAQUE_TYPES (torch 2.13 resolves along the MRO), so the "
    "copy has nothing to call, and a DeviceMesh subclass gets None there"
)

_NO_MESH_IN_COPY = (
    "not yet ported: 0019's copy runs the no-repr subclass with a user Handle and a "
    "string only; ours also carries a real 1-D DeviceMesh over a fake process group "
    "(0012's mesh inner attr), which the in-tree copy does not set up"
)
_AOT_EAGER_ONLY_COPY = (
    "not yet ported: 0019's copy compiles the no-repr subclass with aot_eager only; "
    "ours also runs it through Inductor"
)
#: (series, series file, test) -> why the test of ours is not in that series
ONLY_OURS: dict[tuple[str, str, str], str] = {
    **_listed("test/test_aot_tangent_mismatch_opaque.py", {
        "test_without_an_opaque_the_text_is_this_torchs": (
            "tests install()'s transparency (a subclass without opaques keeps the text "
            "torch prints without install()), in every mode and on every release; 0028 "
            "leaves those tangents' error as it was, so the series has nothing to test"
        ),
    }),
    **_listed("test/test_opaque_value_type_attrs.py", {
        "test_value_type_with_fx_repr_only": (
            "tests what v2.10.0's patch 0000 changes (a value type registered with "
            "__fx_repr__ and no __repr__); torch 2.11 asks for __fx_repr__ itself, so "
            "this series has nothing of its own for it to test"
        ),
    }, V2_11),
    **_listed("test/test_aot_donated_buffer_subclass_mutation.py", {
        "test_cache_warmed_by_stock_torch": (
            "tests install()'s cache keys (a cache warmed by stock torch, then "
            "install()): a patched torch has no stock run in its process, and its "
            "torch_key, a hash of the patched sources, keeps stock entries apart"
        ),
        "test_which_graphs_get_their_own_cache_key": (
            "a unit test of install()'s cache-key check (points/donated_buffers_split.py); "
            "a patched torch needs no such check: torch_key changes with its sources"
        ),
    }),
    **_listed("test/test_opaque_subclass_user_written.py", {
        name: (
            "not yet ported: added when the metadata repr fix (0021) made the lazy "
            "log records (0018) no longer needed to compile, so that their own "
            "effect, no repr when nobody listens, stays tested; 0019's in-tree file "
            "has no repr-counting subclass"
        )
        for name in ("test_training_record_not_formatted", "test_inference_record_not_formatted")
    }),
    **_listed("test/test_opaque_subclass_attrs.py", {
        "test_compiled_autograd_refused_on_torch_2_10": (
            "the v2.10.0 series checks this refusal under upstream's name: its case 2, "
            "test_tensor_subclass_opaque_backward_compiled_autograd, asserts the same "
            "'compiled autograd cannot run' error, where ours skips case 2 on 2.10 and "
            "names the refusal apart"
        ),
    }, V2_10),
    **_listed("test/test_opaque_subclass_attrs.py", {
        "test_compiled_autograd_refused_on_torch_2_10": (
            "torch 2.10 only (ours skips it on 2.11): a 2.11 tree runs compiled autograd "
            "with saved opaques (case 2, in the series too), so there is no refusal to test"
        ),
    }, V2_11),
    **_listed("test/test_opaque_subclass_parity.py", {
        "test_getitem": (
            "not yet ported to v2.10.0: its 0009 leaves it out as 'torch 2.10 has no opaque "
            "members', but 0000 now brings reference-opaque members (USE_REAL, INLINED) and "
            "ours passes on 2.10 with install(); the copy needs v2.11.0's Slots type "
            "registered with members and guard_fn"
        ),
        "test_tensor_subclass_with_opaque_attr": (
            "reads a value opaque's members in compiled code: torch 2.10 treats value "
            "opaques as plain constants and the v2.10.0 series (0000 included) gives "
            "members to reference opaques only; ours skips it on 2.10 likewise"
        ),
        "test_value_type_opaque_unregistered_member_is_not_a_subclass_error": (
            "reads a value opaque's member in compiled code: torch 2.10 treats value "
            "opaques as plain constants and the v2.10.0 series gives members to "
            "reference opaques only; ours skips it on 2.10 likewise"
        ),
    }, V2_10),
    **_listed("test/test_opaque_subclass_parity.py", {
        "test_benchmark_harness_no_pickle_for_opaque_inputs": (
            "not yet ported: added with the point inductor.PythonWrapperCodegen."
            "benchmark_compiled_module after 0009 was cut; series 0005 makes the same "
            "change (None for an opaque graph input), but no in-tree test runs "
            "run_and_get_code over Inductor's output code to look for pickle"
        ),
        "test_broken_sharing_after_cache_hit_inductor": (
            "not yet ported: a differential-suite finding (native torch >= 2.12 hands a "
            "cache entry's outputs the first input's grid); 0009 has no case with the "
            "AOTAutograd and FX graph caches on, two inputs sharing one opaque and then "
            "two apart, which the series' subclass runtime must keep right"
        ),
        "test_opaque_constant_output_with_subclass_output_backend_aot_eager": _OPAQUE_CONSTANT_OUTPUT,
        "test_opaque_constant_output_with_subclass_output_backend_inductor": _OPAQUE_CONSTANT_OUTPUT,
        "test_subclass_opaque_output_reuses_input_proxy": (
            "not yet ported: added after the series was cut (the cases named after "
            "upstream's); it checks that the AOT forward graph returns the opaque input's "
            "own placeholder (0001's subclass outputs), where 0006's "
            "test_no_stale_compile_time_opaque_canary checks only that no get_attr is made"
        ),
        "test_value_type_subclass": (
            "on torch 2.10/2.11 a Python subclass of a registered value type is no opaque "
            "(torch 2.12 looks types up along the MRO, which the series does not "
            "backport), so there it is a plain constant in the subclass's context, a "
            "path the series does not change"
        ),
        "test_value_type_graph_output_backend_aot_eager": _VALUE_OUTPUTS,
        "test_value_type_graph_output_backend_eager": _VALUE_OUTPUTS,
        "test_value_type_graph_output_backend_inductor": _VALUE_OUTPUTS,
        "test_value_type_graph_output_capture_for_export": _VALUE_OUTPUTS,
    }),
    **_listed("test/test_opaque_subclass_fixes.py", {
        "test_non_callable_value_opaque_attr_still_works": (
            "the series has the same case (x * 2 read through len(y._meta.tag), 8.0) as "
            "test_tensor_subclass_with_non_callable_opaque_attr; ours names it as the "
            "control case of the callable-value-opaque fix"
        ),
    }),
    **_listed("test/test_device_mesh_opaque.py", {
        "test_unregistered_member_in_dynamo": (
            "not yet ported to v2.10.0: on 2.10 the error naming the member and "
            "members=... comes from 0000's TorchScriptObjectVariable.var_getattr; 0013's "
            "test_unregistered_member_clear_error covers only a member read by the "
            "subclass's flatten, not one read in the compiled function"
        ),
    }, V2_10),
    **_listed("test/test_device_mesh_opaque.py", {
        "test_unregistered_member_in_dynamo": (
            "stock torch 2.11 Dynamo's error for an unregistered member read in the "
            "compiled function, which the v2.11.0 series does not change; 0013's "
            "test_unregistered_member_clear_error covers the member read by the "
            "subclass's flatten (0012)"
        ),
    }, V2_11),
    **_listed("test/test_dtensor_opaque_mesh.py", {
        "test_fakes_of_one_object_tracked_apart": (
            "the series checks the property in test_fake_mesh_equals_its_mesh (hash(fake) "
            "!= hash(other), 'tracked apart', 0014's identity hash); ours also puts the "
            "two fakes in the proxy tracer's WeakIdKeyDictionary with _WeakHashRef keys, "
            "a torch-internal detail the in-tree copy leaves to the hash"
        ),
        "test_install_without_dtensor_leaves_flatten": (
            "checks install()'s dtensor opt-in, which a patched torch does not have"
        ),
        "test_redistribute_own_mesh_aot_eager": (
            "the series' test_redistribute_own_mesh, run here once per backend"
        ),
        "test_redistribute_own_mesh_inductor": (
            "the series' test_redistribute_own_mesh, run here once per backend"
        ),
    }),
    **_listed("test/test_dtensor_opaque_mesh.py", {
        "test_compare_dtensor_flag_installs_group": (
            "checks that our compare command's --dtensor flag installs our dtensor "
            "points, which a patched torch neither has nor needs"
        ),
    }),
    **_listed("test/test_opaque_subclass_user_written.py", {
        "test_train_device_mesh_aot_eager": _NO_MESH_IN_COPY,
        "test_train_device_mesh_inductor": _NO_MESH_IN_COPY,
        "test_inference_device_mesh_aot_eager": _NO_MESH_IN_COPY,
        "test_inference_device_mesh_inductor": _NO_MESH_IN_COPY,
        "test_other_dim_names_recompile": _NO_MESH_IN_COPY,
        "test_train_handle_inductor": _AOT_EAGER_ONLY_COPY,
        "test_inference_handle_inductor": _AOT_EAGER_ONLY_COPY,
        "test_train_without_opaque_inductor": _AOT_EAGER_ONLY_COPY,
        "test_inference_without_opaque_inductor": _AOT_EAGER_ONLY_COPY,
        "test_mutated_detached_view_one_level": (
            "not yet ported: 0019's copy has only the nested Outer(Inner(...)) case "
            "(test_mutated_detached_view_of_nested_input); ours also runs one level, a "
            "subclass listing its tensor before the opaque"
        ),
    }),
    **_listed("test/test_device_mesh_derived_submesh.py", {
        "test_mesh_classes_have_one_and_others_none": _RECONSTRUCT_FN,
        "test_unhashable_class": _RECONSTRUCT_FN,
    }),
}

#: (series, series file, test) -> why a test of that series is not ours
ONLY_SERIES: dict[tuple[str, str, str], str] = {
    **_listed("test/test_dtensor_opaque_mesh.py", {
        "test_redistribute_own_mesh": (
            "ours runs it once per backend (test_redistribute_own_mesh_aot_eager, _inductor)"
        ),
    }),
    **_listed("test/test_opaque_subclass_attrs.py", {
        "test_unpicklable_reference_opaque_fx_graph_cache": (
            "ours is test/points/test_inductor_cache_key.py::test_unpicklable_reference_opaque_is_cached "
            "(the same LockedHandle case: no FX graph cache bypass, a hit with another "
            "handle), kept beside the cache-key point it guards (series 0005)"
        ),
    }),
    **_listed("test/test_opaque_subclass_user_written.py", {
        "test_no_repr_opaque_inference": (
            "ours runs inference of the no-repr subclass with a user handle through "
            "Inductor (test_inference_handle_inductor); 0019's copy runs every case with "
            "aot_eager, so its inference case keeps its own name"
        ),
    }),
    **_listed("test/test_opaque_subclass_fixes.py", {
        "test_tensor_subclass_with_non_callable_opaque_attr": (
            "ours is test_non_callable_value_opaque_attr_still_works, the same case under "
            "the name of the control case of the callable-value-opaque fix"
        ),
    }),
}

#: words a reason that was never written would carry
_PLACEHOLDER = re.compile(
    r"unreviewed|to be written|\btodo\b|\btbd\b|fixme|\bxxx\b|reason (?:here|later)", re.I
)
MIN_REASON_WORDS = 8


def reason_problem(reason: str) -> str | None:
    """Why ``reason`` is not a reason (None if it is one)."""
    if _PLACEHOLDER.search(reason):
        return f"a placeholder ({_PLACEHOLDER.search(reason).group(0)!r})"
    if len(reason.split()) < MIN_REASON_WORDS:
        return f"fewer than {MIN_REASON_WORDS} words"
    return None


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
    """((series, file, test) of ours missing from that series, (series,
    file, test) of that series missing from ours)."""
    only_ours, only_series = set(), set()
    for series in SERIES:
        for file, theirs in series_tests(series).items():
            ours = our_tests(our_file(file))
            only_ours |= {(series, file, t) for t in ours - theirs}
            only_series |= {(series, file, t) for t in theirs - ours}
    return only_ours, only_series


class TestSeriesManifest(unittest.TestCase):
    def test_series_have_test_files(self):
        self.assertTrue(SERIES)
        for series in SERIES:
            files = series_tests(series)
            self.assertIn("test/test_opaque_subclass_attrs.py", files, series)
            for file in files:
                self.assertTrue(our_file(file).is_file(), f"{series}: {file} is not ours")

    def test_every_case_in_ours_and_each_series_or_listed(self):
        only_ours, only_series = divergences()
        problems = [
            f"{s}: {f}::{t}: ours, not in this series, and not in ONLY_OURS"
            for s, f, t in sorted(only_ours - ONLY_OURS.keys())
        ] + [
            f"{s}: {f}::{t}: in this series, not ours, and not in ONLY_SERIES"
            for s, f, t in sorted(only_series - ONLY_SERIES.keys())
        ] + [
            f"{s}: {f}::{t}: listed in ONLY_OURS but this series has it now"
            for s, f, t in sorted(ONLY_OURS.keys() - only_ours)
        ] + [
            f"{s}: {f}::{t}: listed in ONLY_SERIES but ours has it now"
            for s, f, t in sorted(ONLY_SERIES.keys() - only_series)
        ]
        self.assertFalse(problems, "\n".join(problems))

    def test_every_reason_is_written(self):
        problems = [
            f"{s}: {f}::{t}: {why}: {reason_problem(why)}"
            for table in (ONLY_OURS, ONLY_SERIES)
            for (s, f, t), why in sorted(table.items())
            if reason_problem(why)
        ]
        self.assertFalse(problems, "\n".join(problems))

    def test_placeholder_reasons_rejected(self):
        # what the check above must refuse: the placeholder this manifest
        # started with, a bare note, a reason too short to say why
        for bad in (
            "UNREVIEWED: listed when the manifest test was introduced; reason to be written",
            "TODO: explain why this case is ours only, later on",
            "reason to be written after the next series regeneration",
            "not yet ported",
        ):
            self.assertIsNotNone(reason_problem(bad), bad)
        self.assertIsNone(reason_problem(
            "not yet ported: 0013 runs the ProcessGroup inner attr with aot_eager only"
        ))

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
