"""Tests of the patch-series tools in tools/ (make_checkout, apply_patches,
verify_patches, upstream) and of the matrix's Inductor probe (vec_isa_probe).

Most tests use a small fake torch tree and a fake series (fast, any torch).
Tests that need the real series run on a torch that has one (2.10.0,
2.11.0: its own series) and are skipped with a reason elsewhere.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import unittest
import unittest.mock
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools import _common, ablate_points, make_checkout  # noqa: E402
from torch_subclass_rt._torch_compat import torch_version  # noqa: E402

TORCH_VERSION = torch_version()
#: the series of the running torch, where it has one (2.10.0, 2.11.0)
SERIES_VERSION = TORCH_VERSION
REAL_SERIES = REPO / "patches" / f"v{SERIES_VERSION}"
needs_series_torch = unittest.skipUnless(
    any(REAL_SERIES.glob("*.patch")),
    f"needs a torch with a patch series (patches/v<version>/), whose sources "
    f"the series is written against (this is torch {TORCH_VERSION})",
)


def run_tool(name: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "tools" / name), *args],
        capture_output=True, text=True, env=env, cwd=REPO,
    )


def git(repo: Path, *args: str) -> str:
    return _common.git(repo, *args).stdout.strip()


def tree_state(repo: Path) -> tuple[str, str, str]:
    """HEAD, porcelain status (incl. untracked) and branch list: 'unchanged' means equal."""
    return (
        git(repo, "rev-parse", "HEAD"),
        git(repo, "status", "--porcelain", "--untracked-files=all"),
        git(repo, "branch", "--list"),
    )


def make_fake_torch(root: Path, version: str = "9.9.0") -> Path:
    t = root / "torch"
    (t / "sub").mkdir(parents=True)
    (t / "lib").mkdir()
    (t / "__pycache__").mkdir()
    (t / "__init__.py").write_text("from .sub.mod import f\n")
    (t / "version.py").write_text(f"__version__ = '{version}+cpu'\ngit_version = 'abc'\n")
    (t / "sub" / "__init__.py").write_text("")
    (t / "sub" / "mod.py").write_text("def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x * 2\n")
    (t / "sub" / "mod.pyi").write_text("def f(x: int) -> int: ...\n")
    (t / "lib" / "libtorch_fake.so").write_bytes(b"\x7fELF binary")
    (t / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"pyc")
    return t


class ToolTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="tsrt-test-tools-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def fake_checkout(self, version: str = "9.9.0") -> Path:
        root = make_fake_torch(self.tmp / f"wheel-{version}", version)
        out = self.tmp / f"ck-{version}"
        make_checkout.make_checkout(root, out)
        return out

    def fake_series(self, checkout: Path) -> Path:
        """A two-patch series for the fake checkout, made with git format-patch."""
        work = self.tmp / "series-work"
        subprocess.run(["git", "clone", "-q", str(checkout), str(work)], check=True)
        mod = work / "torch" / "sub" / "mod.py"
        mod.write_text(mod.read_text().replace("x + 1", "x + 2"))
        _common.git(work, "commit", "-qam", "[sub] f adds two\n\nWhy.\n\nTest Plan: none\n", deterministic=True)
        (work / "test").mkdir()
        (work / "test" / "test_f.py").write_text("print('ok')\n")
        _common.git(work, "add", "test")
        _common.git(work, "commit", "-qm", "[test] add test_f\n", deterministic=True)
        out = self.tmp / "patches"
        _common.git(work, "format-patch", "-q", "--zero-commit", "-o", str(out), "v9.9.0..HEAD")
        return out


class TestMakeCheckout(ToolTestCase):
    def test_fake_tree_layout_version_tag(self) -> None:
        ck = self.fake_checkout()
        self.assertEqual((ck / "version.txt").read_text(), "9.9.0\n")
        files = set(git(ck, "ls-files").splitlines())
        self.assertEqual(files, {
            "version.txt", "torch/__init__.py", "torch/version.py",
            "torch/sub/__init__.py", "torch/sub/mod.py", "torch/sub/mod.pyi",
        })  # no binaries, no bytecode
        self.assertEqual(git(ck, "rev-parse", "v9.9.0"), git(ck, "rev-parse", "HEAD"))
        self.assertEqual(_common.detect_version(ck), "9.9.0")

    def test_bytecode_written_later_is_ignored(self) -> None:
        ck = self.fake_checkout()
        cache = ck / "torch" / "sub" / "__pycache__"
        cache.mkdir()
        (cache / "mod.cpython-311.pyc").write_bytes(b"pyc")
        _common.git(ck, "add", "torch")
        self.assertEqual(git(ck, "status", "--porcelain"), "")

    def test_base_commit_is_reproducible(self) -> None:
        root = make_fake_torch(self.tmp / "w")
        a, b = self.tmp / "a", self.tmp / "b"
        _, base_a = make_checkout.make_checkout(root, a)
        _, base_b = make_checkout.make_checkout(root, b)
        self.assertEqual(base_a, base_b)

    def test_cli_refuses_non_empty_out(self) -> None:
        root = make_fake_torch(self.tmp / "w")
        out = self.tmp / "out"
        out.mkdir()
        (out / "x").write_text("")
        proc = run_tool("make_checkout.py", "--torch-root", str(root), "--out", str(out))
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("not empty", proc.stderr)

    @needs_series_torch
    def test_installed_torch(self) -> None:
        out = self.tmp / "real"
        proc = run_tool("make_checkout.py", "--out", str(out))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual((out / "version.txt").read_text(), f"{SERIES_VERSION}\n")
        self.assertTrue((out / "torch" / "_functorch" / "_aot_autograd" / "schemas.py").is_file())
        self.assertEqual(git(out, "ls-files", "*.so"), "")
        git(out, "rev-parse", f"v{SERIES_VERSION}")


class TestApplyPatches(ToolTestCase):
    def test_apply_fake_series(self) -> None:
        ck = self.fake_checkout()
        patches = self.fake_series(ck)
        proc = run_tool("apply_patches.py", str(ck), "--patches-dir", str(patches))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(git(ck, "log", "--format=%s", "v9.9.0..HEAD").splitlines(),
                         ["[test] add test_f", "[sub] f adds two"])

    def test_check_is_a_dry_run(self) -> None:
        ck = self.fake_checkout()
        patches = self.fake_series(ck)
        before = tree_state(ck)
        proc = run_tool("apply_patches.py", str(ck), "--check", "--patches-dir", str(patches))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("would apply 2 patches", proc.stdout)
        self.assertEqual(tree_state(ck), before)
        self.assertEqual(len(git(ck, "worktree", "list").splitlines()), 1)

    def test_conflict_leaves_checkout_unchanged(self) -> None:
        ck = self.fake_checkout()
        patches = self.fake_series(ck)
        mod = ck / "torch" / "sub" / "mod.py"
        mod.write_text(mod.read_text().replace("x + 1", "x - 1"))
        git(ck, "commit", "-qam", "local change")
        before = tree_state(ck)
        for extra in ([], ["--check"]):
            proc = run_tool("apply_patches.py", str(ck), "--patches-dir", str(patches), *extra)
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn("0001-sub-f-adds-two.patch", proc.stderr)
            self.assertIn("torch/sub/mod.py", proc.stderr)
            self.assertEqual(tree_state(ck), before)
            self.assertFalse((Path(git(ck, "rev-parse", "--absolute-git-dir")) / "rebase-apply").exists())

    def test_conflict_in_a_later_patch_rolls_back_earlier_ones(self) -> None:
        ck = self.fake_checkout()
        patches = self.fake_series(ck)
        (ck / "test").mkdir()
        (ck / "test" / "test_f.py").write_text("print('mine')\n")
        git(ck, "add", "test")
        git(ck, "commit", "-qm", "local test")
        before = tree_state(ck)
        proc = run_tool("apply_patches.py", str(ck), "--patches-dir", str(patches))
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("0002-test-add-test_f.patch", proc.stderr)
        self.assertIn("test/test_f.py", proc.stderr)
        self.assertEqual(tree_state(ck), before)

    def test_dirty_tree_is_refused(self) -> None:
        ck = self.fake_checkout()
        patches = self.fake_series(ck)
        mod = ck / "torch" / "sub" / "mod.py"
        mod.write_text(mod.read_text() + "# local edit\n")
        before = tree_state(ck)
        proc = run_tool("apply_patches.py", str(ck), "--patches-dir", str(patches))
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("uncommitted changes", proc.stderr)
        self.assertEqual(tree_state(ck), before)
        self.assertTrue(mod.read_text().endswith("# local edit\n"))

    def test_wrong_base(self) -> None:
        ck = self.fake_checkout("9.8.0")
        proc = run_tool("apply_patches.py", str(ck))
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("no patch series for torch 9.8.0", proc.stderr)

    def test_missing_tag(self) -> None:
        ck = self.fake_checkout()
        patches = self.fake_series(ck)
        git(ck, "tag", "-d", "v9.9.0")
        proc = run_tool("apply_patches.py", str(ck), "--patches-dir", str(patches))
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("no tag v9.9.0", proc.stderr)

    @needs_series_torch
    def test_real_series_check(self) -> None:
        ck = self.tmp / "real"
        make_checkout.make_checkout(make_checkout.default_torch_root(), ck)
        before = tree_state(ck)
        proc = run_tool("apply_patches.py", str(ck), "--check")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(len(re.findall(r"^  \d{4}-", proc.stdout, re.M)), len(list(REAL_SERIES.glob("*.patch"))))
        self.assertEqual(tree_state(ck), before)


def drop_hunk(patch: Path, needle: str) -> None:
    """Remove the one hunk of ``patch`` whose text contains ``needle``."""
    lines = patch.read_text().splitlines(True)
    starts = [i for i, l in enumerate(lines) if l.startswith("@@")]
    for n, s in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        # a hunk ends at the next hunk, the next file's diff, or the trailer
        for j in range(s + 1, end):
            if lines[j].startswith(("diff --git", "-- \n")):
                end = j
                break
        if needle in "".join(lines[s:end]):
            patch.write_text("".join(lines[:s] + lines[end:]))
            return
    raise AssertionError(f"no hunk with {needle!r} in {patch}")


class TestVerifyPatches(ToolTestCase):
    def test_refuses_the_wrong_torch(self) -> None:
        proc = run_tool("verify_patches.py", "--base", "v9.9.0")
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("needs torch 9.9.0", proc.stderr)

    def test_upstream_series_is_for_its_base(self) -> None:
        # patches/upstream/ is written against one release; another base is
        # refused before anything is built
        proc = run_tool("verify_patches.py", "--base", "v2.11.0", "--series", "upstream")
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("--series upstream is written against v2.14.1", proc.stderr)

    def test_upstream_test_must_fail_on_stock(self) -> None:
        from tools import verify_patches

        with tempfile.TemporaryDirectory() as d:
            work = Path(d)
            shows = verify_patches.check_both_ways("test/t.py", "2.14.1", lambda log: 0,
                                                   lambda log: 1, work)
            passes_anyway = verify_patches.check_both_ways("test/t.py", "2.14.1", lambda log: 0,
                                                           lambda log: 0, work)
            (work / "in-tree-t.log").write_text("boom\n")
            broken = verify_patches.check_both_ways("test/t.py", "2.14.1", lambda log: 1,
                                                    lambda log: 1, work)
        self.assertEqual(shows, [])
        self.assertEqual(len(passes_anyway), 1)
        self.assertIn("passes on stock torch 2.14.1 too", passes_anyway[0])
        self.assertEqual(len(broken), 1)
        self.assertIn("test/t.py failed (exit 1)", broken[0])

    def test_upstream_series_adds_its_tests(self) -> None:
        # each commit of the upstream series carries an in-tree test
        from tools import verify_patches

        patches = _common.series(verify_patches.UPSTREAM_SERIES)
        self.assertTrue(patches)
        for patch in patches:
            self.assertTrue(verify_patches.in_tree_tests([patch]), patch.name)

    @needs_series_torch
    def test_dropped_hunk_fails(self) -> None:
        # Dropping the hunk that fakeifies opaques in unwrap_tensor_subclasses
        # brings back the silent bug (compile-time object captured as a graph
        # constant): the series still applies, the patched suite must fail.
        patches = self.tmp / "patches"
        shutil.copytree(REAL_SERIES, patches)
        first = sorted(patches.glob("0001-*.patch"))[0]
        drop_hunk(first, "out[0].append(_maybe_fakeify_opaque(t))")
        proc = run_tool("verify_patches.py", "--base", f"v{SERIES_VERSION}",
                        "--patches-dir", str(patches), "--skip-backport-run", "--fail-fast")
        self.assertNotEqual(proc.returncode, 0, proc.stdout)
        self.assertIn("FAILED: verify_patches", proc.stderr)
        self.assertIn("suite in patched mode failed", proc.stderr)
        # stopped at the first failing test, and before the in-tree step
        self.assertIn("stopping after 1 failures", proc.stderr)
        self.assertNotIn("in-tree test", proc.stdout)

    def test_in_tree_tests_are_the_series_own(self) -> None:
        # the test files the series adds, in series order, each once; a
        # series for another base runs what it adds, nothing it does not
        from tools import verify_patches

        def patch(name: str, *paths: str) -> Path:
            p = self.tmp / name
            p.write_text("".join(f"diff --git a/{x} b/{x}\n" for x in paths))
            return p

        series = [
            patch("0001-a.patch", "torch/a.py"),
            patch("0002-b.patch", "test/test_b.py", "test/data/b.json"),
            patch("0003-c.patch", "torch/c.py", "test/test_b.py"),
            patch("0004-d.patch", "test/test_a.py"),
        ]
        self.assertEqual(verify_patches.in_tree_tests(series), ["test/test_b.py", "test/test_a.py"])
        self.assertEqual(verify_patches.in_tree_tests(series[:1]), [])

    def test_each_series_runs_what_it_carries(self) -> None:
        # v2.10.0 carries DeviceMesh / ProcessGroup as opaques and derived
        # submeshes (0012, 0013, 0016, 0017), user-written subclasses (0019)
        # lazy members (0020), the metadata repr (0021), the donated
        # buffers and saved activations' strides of a mutated subclass
        # input (0024, 0025), isinstance of a fake process group (0027) and
        # the tangent mismatch message (0028), and 0000's registration
        # messages, not DTensor's
        # mesh attr (0014, 0015): it runs their in-tree tests, and no DTensor
        # suite
        from tools import verify_patches

        self.assertEqual(
            verify_patches.in_tree_tests(_common.series(_common.series_dir("2.10.0"))),
            [
                "test/test_opaque_registration_messages.py",
                "test/test_opaque_subclass_attrs.py",
                "test/test_opaque_subclass_parity.py",
                "test/test_device_mesh_opaque.py",
                "test/test_device_mesh_derived_submesh.py",
                "test/test_opaque_subclass_user_written.py",
                "test/test_opaque_lazy_members.py",
                "test/test_aot_metadata_repr_subclass.py",
                "test/test_aot_donated_buffer_subclass_mutation.py",
                "test/test_aot_saved_strides_subclass_mutation.py",
                "test/test_fake_process_group_isinstance.py",
                "test/test_aot_tangent_mismatch_opaque.py",
            ],
        )
        dtensor = REPO / "test" / "distributed" / "test_dtensor_opaque_mesh.py"
        self.assertIn(dtensor, verify_patches.SUITES)
        self.assertEqual(
            verify_patches.suites_for("2.10.0"),
            tuple(s for s in verify_patches.SUITES if s != dtensor),
        )
        self.assertIn(REPO / "test" / "distributed" / "test_device_mesh_opaque.py", verify_patches.suites_for("2.10.0"))
        self.assertEqual(verify_patches.suites_for("2.11.0"), verify_patches.SUITES)

    def test_in_tree_test_never_accepts(self) -> None:
        # With EXPECTTEST_ACCEPT=1 set by whoever runs verify_patches, the
        # in-tree test's assertExpectedInline would rewrite the throwaway
        # checkout and pass: the in-tree run must compare, as the suites do.
        from tools import verify_patches

        checkout = self.tmp / "checkout"
        (checkout / "test").mkdir(parents=True)
        (checkout / "test" / "test_env.py").write_text(
            "import os, sys\n"
            "sys.exit(3 if os.environ.get('EXPECTTEST_ACCEPT') else 0)\n"
        )
        log = self.tmp / "in-tree.log"
        with unittest.mock.patch.dict(os.environ, {"EXPECTTEST_ACCEPT": "1"}):
            rc = verify_patches.run_in_tree_test(checkout, self.tmp / "site", log, "test/test_env.py")
        self.assertEqual(rc, 0, log.read_text())


def _point(name: str, *tests: str, speed_only: str = ""):
    from torch_subclass_rt.patching.registry import PatchPoint

    return PatchPoint(
        name=name, target=f"fake.module:{name.replace('.', '_')}", build=lambda o: o,
        versions=frozenset({"9.9.0"}), modes=frozenset({"backport"}), reason="test",
        guarded_by=tests, speed_only=speed_only,
        series_none="" if speed_only else "a test point",
    )


class FakeRunner:
    """run(excluded, tests): each test's outcome by the points left out.
    ``fails_without[test]`` = the point names whose absence makes it fail."""

    def __init__(self, fails_without, skipped=(), missing=()):
        self.fails_without = fails_without
        self.skipped, self.missing = set(skipped), set(missing)
        self.calls = []

    def __call__(self, excluded, tests):
        self.calls.append((tuple(excluded), tuple(tests)))
        out = {}
        for t in tests:
            if t in self.missing:
                continue
            if t in self.skipped:
                out[t] = "skipped"
            else:
                broken = set(excluded) & set(self.fails_without.get(t, ()))
                out[t] = "failed" if broken else "passed"
        return out


class TestAblatePoints(unittest.TestCase):
    def test_guarded_unguarded_and_untested(self) -> None:
        points = [_point("a.one", "t1"), _point("a.two", "t2"), _point("b.three")]
        run = FakeRunner({"t1": ["a.one"], "t2": ["a.one"]})
        report = ablate_points.ablate(points, run)
        self.assertFalse(report.ok)
        self.assertEqual([r.excluded for r in report.unguarded], [("a.two",)])
        self.assertEqual(report.unguarded[0].still_passing, ["t2"])
        self.assertEqual(report.no_tests, ["b.three"])
        self.assertEqual(report.broken_tests, [])
        # the check run installs everything; each ablation runs only its tests
        self.assertEqual(run.calls[0], ((), ("t1", "t2")))
        self.assertIn((("a.one",), ("t1",)), run.calls)
        text = ablate_points.format_report(report, points)
        self.assertIn("UNGUARDED  a.two", text)
        self.assertIn("1 guarded, 1 unguarded, 1 without tests", text)

    def test_one_failing_test_guards(self) -> None:
        # t2 guards a.one in another mode: noted, not required here
        points = [_point("a.one", "t1", "t2")]
        report = ablate_points.ablate(points, FakeRunner({"t1": ["a.one"]}))
        self.assertTrue(report.ok)
        self.assertEqual(report.results[0].still_passing, ["t2"])
        self.assertIn("(passes here: t2)", ablate_points.format_report(report, points))

    def test_all_guarded(self) -> None:
        points = [_point("a.one", "t1"), _point("a.two", "t2", speed_only="1.3 -> 1.2")]
        report = ablate_points.ablate(points, FakeRunner({"t1": ["a.one"], "t2": ["a.two"]}), jobs=2)
        self.assertTrue(report.ok)
        self.assertIn("[speed-only: 1.3 -> 1.2]", ablate_points.format_report(report, points))

    def test_named_test_missing_or_failing_with_all_points(self) -> None:
        points = [_point("a.one", "t1"), _point("a.two", "t2")]
        run = FakeRunner({"t1": ["a.one"], "t2": ["a.one", "a.two"]}, missing=["t1"])
        report = ablate_points.ablate(points, run)
        self.assertEqual(report.broken_tests, ["t1"])
        self.assertFalse(report.ok)

    def test_tests_skipped_on_this_torch_do_not_count(self) -> None:
        points = [_point("a.one", "t1", "t_forced"), _point("a.two", "t_forced")]
        run = FakeRunner({"t1": ["a.one"]}, skipped=["t_forced"])
        report = ablate_points.ablate(points, run)
        self.assertEqual([r.excluded for r in report.results], [("a.one",)])
        self.assertEqual(report.results[0].tests, ("t1",))
        self.assertEqual(report.no_tests, ["a.two"])

    def test_check_shares_the_pool_with_the_units(self) -> None:
        # The check (every named test) was run alone before the units, with
        # all but one of the jobs idle. With two jobs, a unit must start
        # while the check still runs: the check here waits for one to.
        import threading

        unit_started = threading.Event()

        class Runner(FakeRunner):
            def __call__(self, excluded, tests):
                if excluded:
                    unit_started.set()
                elif not unit_started.wait(timeout=10):
                    raise AssertionError("no unit ran while the check was running")
                return super().__call__(excluded, tests)

        points = [_point("a.one", "t1"), _point("a.two", "t2", "t_forced"), _point("a.three", "t_forced")]
        run = Runner({"t1": ["a.one"], "t2": ["a.two"]}, skipped=["t_forced"])
        report = ablate_points.ablate(points, run, jobs=2)
        self.assertEqual((report.unguarded, report.broken_tests), ([], []))
        # the same report a check-first run gives: skipped tests left out
        self.assertEqual([(r.excluded, r.tests) for r in report.results],
                         [(("a.one",), ("t1",)), (("a.two",), ("t2",))])
        self.assertEqual(report.no_tests, ["a.three"])

    def test_known_outcomes_shorten_the_check(self) -> None:
        # the session's suite already ran t1 with every point: the check
        # runs only t2, and t1's known skip leaves it out of its unit
        points = [_point("a.one", "t1"), _point("a.two", "t2")]
        run = FakeRunner({"t2": ["a.two"]})
        report = ablate_points.ablate(points, run, known={"t1": "skipped", "t9": "passed"})
        self.assertIn(((), ("t2",)), run.calls)
        self.assertNotIn(((), ("t1", "t2")), run.calls)
        self.assertEqual([(r.excluded, r.tests) for r in report.results], [(("a.two",), ("t2",))])
        self.assertEqual(report.check, {"t1": "skipped", "t2": "passed"})

    def test_group_is_left_out_together(self) -> None:
        points = [_point("a.one", "t1"), _point("a.two", "t1"), _point("b.three", "t3")]
        run = FakeRunner({"t1": ["a.one"], "t3": ["b.three"]})
        report = ablate_points.ablate(points, run, groups=["a"])
        self.assertEqual([r.excluded for r in report.results], [("a.one", "a.two")])
        self.assertTrue(report.ok)
        with self.assertRaises(SystemExit):
            ablate_points.select_units(points, names=["nope"])

    def test_opt_in_group_is_left_out_together(self) -> None:
        from dataclasses import replace

        points = [
            replace(_point("a.one", "t1"), group="g"),
            replace(_point("b.two", "t2"), group="g"),
            _point("b.three", "t3"),
        ]
        units = ablate_points.select_units(points, groups=["g"])
        self.assertEqual(units[0], (("a.one", "b.two"), ("t1", "t2")))

    def test_parse_junit_node_ids(self) -> None:
        xml = textwrap.dedent("""\
            <testsuites><testsuite>
            <testcase classname="test.test_x.TestA" name="test_ok" file="test/test_x.py"/>
            <testcase classname="test.test_x.TestA" name="test_bad" file="test/test_x.py">
              <failure message="x"/></testcase>
            <testcase classname="test.test_x" name="test_fn" file="test/test_x.py">
              <skipped message="no gpu"/></testcase>
            <testcase classname="test.test_x" name="test_err" file="test/test_x.py">
              <error message="teardown"/></testcase>
            </testsuite></testsuites>
            """)
        self.assertEqual(
            ablate_points.parse_junit(xml),
            {
                "test/test_x.py::TestA::test_ok": "passed",
                "test/test_x.py::TestA::test_bad": "failed",
                "test/test_x.py::test_fn": "skipped",
                "test/test_x.py::test_err": "failed",
            },
        )

    def test_install_leaves_out_excluded_points(self) -> None:
        # install() reads TSRT_EXCLUDE_POINTS; a name it does not know is an
        # error (a typo must not make an ablation pass by leaving out nothing)
        code = textwrap.dedent("""\
            import torch_subclass_rt as t
            from torch_subclass_rt import _torch_compat as c
            force = c.torch_version() not in c.BACKPORT_VERSIONS
            try:
                st = t.install(force=force)
            except t.UnsupportedTorchVersion:
                print("unsupported")
            except ValueError as e:
                print("refused", e)
            else:
                print(st.mode, ",".join(st.points))
            """)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("TSRT_MODE", None)
        run = lambda excl: subprocess.run(  # noqa: E731
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
            env={**env, "TSRT_EXCLUDE_POINTS": excl},
        ).stdout.strip()
        out = run("")
        if out == "unsupported":
            self.skipTest(f"torch {TORCH_VERSION} has no patch points")
        mode, points = out.split(" ", 1)
        first = points.split(",")[0]
        out = run(first)
        self.assertEqual(out.split(" ", 1)[0], mode)
        self.assertNotIn(first, out.split(" ", 1)[1].split(","))
        self.assertEqual(len(out.split(" ", 1)[1].split(",")), len(points.split(",")) - 1)
        out = run("no.such_point")
        self.assertTrue(out.startswith("refused"), out)
        self.assertIn("no.such_point", out)


class TestVecIsaProbe(unittest.TestCase):
    """tools/vec_isa_probe.py: the matrix trusts the CPU flags only where
    Inductor's own check would agree."""

    def test_a_failed_build_check_is_not_trusted(self) -> None:
        from torch._inductor import cpu_vec_isa

        from tools import vec_isa_probe

        # asked the trusting way first, so Inductor's per-process caches
        # hold "usable" for each ISA: the probe must not reuse those answers
        trusted = vec_isa_probe.isa_names(trust_cpu_flags=True)
        if not trusted:
            self.skipTest("the CPU lists no vector ISA Inductor knows: nothing to trust")
        with unittest.mock.patch.object(cpu_vec_isa.VecISA, "check_build", return_value=False):
            self.assertEqual(vec_isa_probe.isa_names(trust_cpu_flags=False), [])
            self.assertFalse(vec_isa_probe.skipping_is_safe())
        # and the patched answers do not outlive the probe
        self.assertEqual(vec_isa_probe.isa_names(trust_cpu_flags=True), trusted)

    def test_prints_the_setting_only_when_safe(self) -> None:
        from tools import vec_isa_probe

        for safe, expected in ((True, vec_isa_probe.SETTING + "\n"), (False, "")):
            answers = {False: ["avx2"], True: ["avx2"] if safe else ["avx512", "avx2"]}
            with unittest.mock.patch.object(vec_isa_probe, "isa_names",
                                            side_effect=lambda trust_cpu_flags: answers[trust_cpu_flags]), \
                    unittest.mock.patch("sys.stdout", new_callable=io.StringIO) as out, \
                    unittest.mock.patch("sys.stderr", new_callable=io.StringIO):
                self.assertEqual(vec_isa_probe.main(), 0)
            self.assertEqual(out.getvalue(), expected)


def _load_noxfile():
    """noxfile.py as a module, with a stand-in for nox (the test
    environments do not install it): its decorators return the function."""
    import importlib.util
    import types

    fake = types.ModuleType("nox")
    fake.options = types.SimpleNamespace()
    fake.Session = object
    fake.session = lambda f=None, **_: f if f is not None else (lambda g: g)
    fake.parametrize = lambda *_a, **_k: (lambda f: f)
    spec = importlib.util.spec_from_file_location("_tsrt_noxfile", REPO / "noxfile.py")
    mod = importlib.util.module_from_spec(spec)
    with unittest.mock.patch.dict(sys.modules, {"nox": fake}):
        spec.loader.exec_module(mod)
    return mod


class TestNoxfileIsaSetting(unittest.TestCase):
    def setUp(self) -> None:
        self.noxfile = _load_noxfile()
        key = self.noxfile._tool("vec_isa_probe").SETTING.partition("=")[0]
        patcher = unittest.mock.patch.dict(os.environ)
        patcher.start()
        self.addCleanup(patcher.stop)
        os.environ.pop(key, None)

    def test_install_only_logs_nothing(self) -> None:
        # --install-only runs nothing (session.run returns None): no probe
        # answer, and no "checks the vector ISAs in every process" either
        session = unittest.mock.Mock()
        session.run.return_value = None
        self.assertEqual(self.noxfile._inductor_isa_env(session), {})
        session.log.assert_not_called()

    def test_setting_taken_only_when_the_probe_prints_it(self) -> None:
        setting = self.noxfile._tool("vec_isa_probe").SETTING
        for out, expected in ((f"a torch warning\n{setting}\n", dict([setting.split("=")])), ("", {})):
            session = unittest.mock.Mock()
            session.run.return_value = out
            self.assertEqual(self.noxfile._inductor_isa_env(session), expected)
            session.log.assert_called_once()


class TestUpstream(ToolTestCase):
    def fake_ghstack(self) -> tuple[Path, Path]:
        bindir = self.tmp / "bin"
        bindir.mkdir()
        record = self.tmp / "ghstack-record.txt"
        script = bindir / "ghstack"
        script.write_text(textwrap.dedent(f"""\
            #!/bin/sh
            {{
              echo "argv: $*"
              echo "cwd: $(pwd)"
              git log --format=%s v9.9.0..HEAD
            }} > {record}
            """))
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        return bindir, record

    def upstream_checkout(self) -> tuple[Path, Path]:
        ck = self.fake_checkout()
        patches = self.fake_series(ck)
        clone = self.tmp / "pytorch"
        subprocess.run(["git", "clone", "-q", str(ck), str(clone)], check=True)
        return clone, patches

    def test_submits_the_series_with_ghstack(self) -> None:
        clone, patches = self.upstream_checkout()
        bindir, record = self.fake_ghstack()
        env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
        proc = run_tool("upstream.py", str(clone), "--patches-dir", str(patches),
                        "--base-branch", "release/9.9", "--", "--draft", env=env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        text = record.read_text().splitlines()
        self.assertEqual(text[0], "argv: submit --base release/9.9 v9.9.0..HEAD --draft")
        self.assertEqual(Path(text[1][len("cwd: "):]).resolve(), clone.resolve())
        self.assertEqual(text[2:], ["[test] add test_f", "[sub] f adds two"])
        self.assertEqual(git(clone, "rev-parse", "--abbrev-ref", "HEAD"), "opaque-subclass-attrs-v9.9.0")

    def test_dry_run_does_not_call_ghstack(self) -> None:
        clone, patches = self.upstream_checkout()
        bindir, record = self.fake_ghstack()
        env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
        proc = run_tool("upstream.py", str(clone), "--patches-dir", str(patches), "--dry-run", env=env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("would run", proc.stdout)
        self.assertIn("ghstack submit v9.9.0..HEAD", proc.stdout)
        self.assertFalse(record.exists())
        self.assertEqual(git(clone, "log", "--format=%s", "v9.9.0..HEAD").splitlines(),
                         ["[test] add test_f", "[sub] f adds two"])

    def test_conflict_restores_branch(self) -> None:
        clone, patches = self.upstream_checkout()
        drop_hunk(sorted(patches.glob("0001-*.patch"))[0], "x + 2")  # empty patch: am fails
        before = tree_state(clone)
        proc = run_tool("upstream.py", str(clone), "--patches-dir", str(patches), "--dry-run")
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("0001-sub-f-adds-two.patch", proc.stderr)
        self.assertEqual(tree_state(clone), before)


if __name__ == "__main__":
    unittest.main()
