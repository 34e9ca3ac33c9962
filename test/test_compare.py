"""``python -m torch_subclass_rt compare -- <pytest args>`` on small suites.

A generated suite with planted differences (a test that passes only stock,
one that checks a spawned subprocess is stock too, one that fails only
stock) must be reported test by test with the failing side's first error
line, and exit 1; a suite with no difference must exit 0. Holds in every
mode: install() changes ``status().mode`` on every supported torch (the
matrix runs it on 2.11 and 2.13 only: noxfile.COMPARE_TESTS).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PLANTED = '''
import subprocess, sys
import pytest
import torch_subclass_rt as tsrt

def test_same_everywhere():
    assert 1 + 1 == 2

def test_only_stock_passes():
    assert tsrt.status().mode == "off", f"installed here: {tsrt.status().mode}"

def test_subprocess_is_installed_too():
    mode = subprocess.run(
        [sys.executable, "-c", "import torch_subclass_rt as t; print(t.status().mode)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert mode == "off", f"subprocess mode {mode}"

def test_only_installed_passes():
    if tsrt.status().mode == "off":
        raise ValueError("stock here")

@pytest.mark.skip(reason="skipped in both")
def test_skipped():
    pass

@pytest.mark.xfail(reason="fails in both", strict=True)
def test_xfail():
    assert False
'''

SAME = '''
import os
from pathlib import Path

import torch
import torch_subclass_rt as tsrt

def test_records_inductor_cache_dir():
    # identical outcome in both runs; the file name tells the runs apart
    Path(f"cache-dir-{tsrt.status().mode}").write_text(os.environ["TORCHINDUCTOR_CACHE_DIR"])

def test_tensor_math():
    assert torch.ones(3).sum().item() == 3.0

def test_compiled():
    f = torch.compile(lambda x: x.sin() + 1, backend="eager")
    x = torch.randn(4)
    assert torch.allclose(f(x), x.sin() + 1)
'''


class TestCompare(unittest.TestCase):
    def run_compare(self, suite_source: str, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
        (tmp / "test_suite.py").write_text(textwrap.dedent(suite_source))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        for var in ("TSRT_COMPARE_INSTALL", "TSRT_COMPARE_REPORT", "TSRT_MODE"):
            env.pop(var, None)
        return subprocess.run(
            [sys.executable, "-m", "torch_subclass_rt", "compare", "--quiet", "--keep",
             str(tmp / "runs"), *extra, "--", "-q", "test_suite.py"],
            cwd=tmp, env=env, capture_output=True, text=True, timeout=600,
        )

    def test_planted_differences_are_reported(self):
        self._planted_differences_are_reported()

    def test_planted_differences_are_reported_parallel(self):
        # the two arms at once: the same report
        self._planted_differences_are_reported("--parallel")

    def _planted_differences_are_reported(self, *extra):
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            proc = self.run_compare(PLANTED, tmp, *extra)
            out = proc.stdout
            self.assertEqual(proc.returncode, 1, out + proc.stderr)
            self.assertIn("3 test(s) differ (stock -> with install()):", out)
            self.assertIn("test_suite.py::test_only_stock_passes: passed -> failed", out)
            self.assertIn("installed: AssertionError: installed here:", out)
            self.assertIn("test_suite.py::test_subprocess_is_installed_too: passed -> failed", out)
            self.assertIn("installed: AssertionError: subprocess mode", out)
            self.assertIn("test_suite.py::test_only_installed_passes: failed -> passed", out)
            self.assertIn("stock: ValueError: stock here", out)
            for same in ("test_same_everywhere", "test_skipped", "test_xfail"):
                self.assertNotIn(same, out.split("differ")[1])
            self.assertIn("stock: 1 failed, 3 passed, 1 skipped, 1 xfailed", out)
            self.assertIn("installed: 2 failed, 2 passed, 1 skipped, 1 xfailed", out)
            for arm in ("stock", "installed"):
                self.assertTrue((tmp / "runs" / arm / "outcomes.json").exists())

    def test_no_difference_exits_zero(self):
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            proc = self.run_compare(SAME, tmp)
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            self.assertIn("same outcome for all 3 tests, stock and with install()", proc.stdout)
            # each run had its own, fresh inductor cache
            stock = (tmp / "cache-dir-off").read_text()
            (installed,) = [p.read_text() for p in tmp.glob("cache-dir-*") if p.name != "cache-dir-off"]
            self.assertEqual(stock, str(tmp / "runs" / "stock" / "inductor-cache"))
            self.assertEqual(installed, str(tmp / "runs" / "installed" / "inductor-cache"))

    def test_pytest_that_cannot_start_exits_two(self):
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            (tmp / "test_suite.py").write_text("")
            proc = subprocess.run(
                [sys.executable, "-m", "torch_subclass_rt", "compare", "--quiet", "--",
                 "--no-such-pytest-option"],
                cwd=tmp, env={**os.environ, "PYTHONPATH": str(REPO)},
                capture_output=True, text=True, timeout=600,
            )
            self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
            self.assertIn("no test outcomes from the stock and installed run", proc.stdout)


if __name__ == "__main__":
    unittest.main()
