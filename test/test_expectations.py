"""The expectation files under test/expected/ and the harness that reads them.

* Every graph dump file ``<TestClass>.<test>.<name>.txt`` (shared, or a
  ``v<major>.<minor>/`` override) belongs to a test method that exists: a
  *static* check, which maps file names back to the test classes of the
  modules that write dumps (importing them; device-instantiated ``...CPU``
  classes included), so a partial run (``-k``) cannot false-alarm. The
  ``source_edits/`` diffs are checked by ``test_source_edits.py``.
* Every override has a shared counterpart (or a reason recorded in
  :data:`OVERRIDES_WITHOUT_SHARED`) and differs from it.
* ``harness.assertExpectedGraph``: under ``EXPECTTEST_ACCEPT=1`` an override
  the running torch no longer needs is deleted; a mismatch shows the diff
  expected-first.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import harness

from torch._dynamo.test_case import TestCase

MODE = harness.current_mode()

TEST_DIR = Path(harness.__file__).resolve().parent
#: sub-directories of test/expected/ that hold something other than dumps
OTHER_DIRS = {"source_edits"}
_VERSION_DIR = re.compile(r"v\d+\.\d+")

#: "v<major>.<minor>/<file name>" -> why that release has a dump no other
#: release shares (none today; the harness writes the shared file first)
OVERRIDES_WITHOUT_SHARED: dict[str, str] = {}


def dump_writing_modules(test_dir: Path = TEST_DIR) -> list[str]:
    """Test modules that can write graph dumps: those that call the harness's
    ``assertExpectedGraph``/``assertExpectedGraphs``."""
    names = []
    for path in sorted(test_dir.rglob("test_*.py"), key=lambda p: p.name):
        if path.name == Path(__file__).name:
            continue
        if "assertExpectedGraph" in path.read_text():
            names.append(path.stem)
    return names


def known_test_methods(module_names) -> set[tuple[str, str]]:
    """(class name, method name) of every test method in those modules, as
    they exist after import (``instantiate_device_type_tests`` classes)."""
    # the folders of test/ hold the modules, as pytest imports them
    for folder in sorted({p.parent for p in TEST_DIR.rglob("test_*.py")}):
        if str(folder) not in sys.path:
            sys.path.append(str(folder))
    known = set()
    for name in module_names:
        module = importlib.import_module(name)
        for cls_name, cls in vars(module).items():
            if inspect.isclass(cls) and issubclass(cls, unittest.TestCase):
                for attr in dir(cls):
                    if attr.startswith("test") and callable(getattr(cls, attr, None)):
                        known.add((cls_name, attr))
    return known


def expectation_problems(expected_dir: Path, known: set[tuple[str, str]]) -> list[str]:
    """What is wrong with the dump files in ``expected_dir``: files of no
    existing test, overrides without a shared file or equal to it, and
    anything that is not a dump where dumps live."""
    problems = []

    def owner_exists(fname: str) -> bool:
        parts = fname.split(".")
        return len(parts) >= 4 and parts[-1] == "txt" and (parts[0], parts[1]) in known

    for path in sorted(expected_dir.iterdir()):
        rel = path.relative_to(expected_dir)
        if path.is_dir():
            if path.name in OTHER_DIRS:
                continue
            if not _VERSION_DIR.fullmatch(path.name):
                problems.append(f"{rel}/: not a v<major>.<minor> override directory")
                continue
            for override in sorted(path.iterdir()):
                orel = f"{path.name}/{override.name}"
                shared = expected_dir / override.name
                if not owner_exists(override.name):
                    problems.append(f"{orel}: no test method reads it")
                elif not shared.exists():
                    if orel not in OVERRIDES_WITHOUT_SHARED:
                        problems.append(
                            f"{orel}: override without a shared {override.name} "
                            "(record the shared dump, or give the reason in "
                            "OVERRIDES_WITHOUT_SHARED)"
                        )
                elif override.read_text() == shared.read_text():
                    problems.append(
                        f"{orel}: equal to the shared file, overrides nothing (delete it; "
                        "EXPECTTEST_ACCEPT=1 on that torch does)"
                    )
        elif not owner_exists(path.name):
            problems.append(f"{rel}: no test method reads it")
    return problems


class TestExpectedDirectory(TestCase):
    def test_every_expectation_file_is_read_by_a_test(self):
        known = known_test_methods(dump_writing_modules())
        self.assertTrue(known)
        problems = expectation_problems(harness.EXPECTED_DIR, known)
        for key in OVERRIDES_WITHOUT_SHARED:
            if not (harness.EXPECTED_DIR / key).exists():
                problems.append(f"OVERRIDES_WITHOUT_SHARED names {key}, which does not exist")
        if problems:
            self.fail("test/expected/ holds files no test reads or needs:\n  "
                      + "\n  ".join(problems))

    def test_checker_finds_orphans(self):
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            (d / "TestA.test_x.dynamo.0.txt").write_text("a\n")
            (d / "TestA.test_gone.dynamo.0.txt").write_text("a\n")
            (d / "README").write_text("")
            (d / "v2.11").mkdir()
            (d / "v2.11" / "TestA.test_x.dynamo.0.txt").write_text("a\n")  # == shared
            (d / "v2.11" / "TestA.test_x.aot_fw.0.txt").write_text("b\n")  # no shared
            (d / "v2.11" / "TestB.test_y_cpu.counts.txt").write_text("c\n")  # no test
            (d / "junk").mkdir()
            (d / "source_edits").mkdir()
            (d / "source_edits" / "p.diff").write_text("")
            got = expectation_problems(d, {("TestA", "test_x")})
        self.assertEqual(
            [p.split(":")[0] for p in got],
            [
                "README",
                "TestA.test_gone.dynamo.0.txt",
                "junk/",
                "v2.11/TestA.test_x.aot_fw.0.txt",
                "v2.11/TestA.test_x.dynamo.0.txt",
                "v2.11/TestB.test_y_cpu.counts.txt",
            ],
            got,
        )

    def test_device_instantiated_classes_are_known(self):
        known = known_test_methods(["test_opaque_subclass_attrs"])
        self.assertTrue(any(cls.endswith("CPU") and m.endswith("_cpu") for cls, m in known))


class _Dummy(unittest.TestCase):
    def test_dump(self):
        pass


class TestAssertExpectedGraph(TestCase):
    """The harness's record/compare logic on a scratch expected dir."""

    def setUp(self):
        super().setUp()
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self._tmp.name)
        patcher = mock.patch.object(harness, "EXPECTED_DIR", self.dir)
        patcher.start()
        self.addCleanup(patcher.stop)
        self.addCleanup(self._tmp.cleanup)
        self.dummy = _Dummy("test_dump")
        self.shared, self.override = harness.expected_paths(self.dummy, "g")

    def dump(self, text, accept):
        env = {"EXPECTTEST_ACCEPT": "1" if accept else ""}
        with mock.patch.dict(os.environ, env):
            harness.assertExpectedGraph(self.dummy, text, "g")

    def write(self, path, text):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def test_accept_deletes_override_equal_to_shared(self):
        self.write(self.shared, "same\n")
        self.write(self.override, "same\n")
        self.dump("same\n", accept=True)
        self.assertFalse(self.override.exists())
        self.assertFalse(self.override.parent.exists(), "empty version dir removed")
        self.assertEqual(self.shared.read_text(), "same\n")

    def test_accept_deletes_stale_override_when_shared_matches(self):
        self.write(self.shared, "now shared\n")
        self.write(self.override, "old\n")
        self.dump("now shared\n", accept=True)
        self.assertFalse(self.override.exists())

    def test_accept_writes_override_when_different(self):
        self.write(self.shared, "shared\n")
        self.dump("mine\n", accept=True)
        self.assertEqual(self.override.read_text(), "mine\n")
        self.assertEqual(self.shared.read_text(), "shared\n")

    def test_accept_writes_missing_shared(self):
        self.dump("first\n", accept=True)
        self.assertEqual(self.shared.read_text(), "first\n")
        self.assertFalse(self.override.exists())

    def test_mismatch_diff_is_expected_first(self):
        self.write(self.shared, "line1\nexpected line\n")
        with self.assertRaises(AssertionError) as cm:
            self.dump("line1\nactual line\n", accept=False)
        msg = str(cm.exception)
        self.assertIn("-expected line\n+actual line\n", msg)
        self.assertLess(msg.index("(expected)"), msg.index("+++ actual"))


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
