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

REPO = Path(__file__).resolve().parents[2]

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


ONLY_FIXES = '''
import torch_subclass_rt as tsrt

def test_same_everywhere():
    assert 1 + 1 == 2

def test_fixed_by_install():
    if tsrt.status().mode == "off":
        raise RuntimeError("a torch bug install() carries the fix for")
'''

# A subclass without a __repr__ and without any opaque (a string in its
# flatten context), trained under compile: torch 2.10.0 / 2.11.0 fail it
# (GuardOnDataDependentSymNode: the AOT metadata log record is formatted
# eagerly); install() carries 2.12's lazy formatting for every graph
# (points/lazy_log_and_donated_buffers.py, Note [Scope of the fixes outside the feature]).
NO_REPR = '''
import torch
import torch.utils._pytree as pytree


class NoRepr(torch.Tensor):
    @staticmethod
    def __new__(cls, local, tag):
        return torch.Tensor._make_wrapper_subclass(
            cls, local.shape, strides=local.stride(), dtype=local.dtype,
            requires_grad=local.requires_grad,
        )

    def __init__(self, local, tag):
        self._local = local
        self.tag = tag

    def __tensor_flatten__(self):
        return ["_local"], self.tag

    @staticmethod
    def __tensor_unflatten__(inner, tag, outer_size, outer_stride):
        return NoRepr(inner["_local"], tag)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tag = next(a.tag for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, NoRepr))
        args, kwargs = pytree.tree_map_only(NoRepr, lambda t: t._local, (args, kwargs))
        out = func(*args, **kwargs)
        return pytree.tree_map_only(torch.Tensor, lambda t: NoRepr(t, tag), out)


def test_train_no_repr_subclass():
    f = torch.compile(lambda x: (x.sin() * 2).cos(), backend="aot_eager", fullgraph=True)
    x = NoRepr(torch.randn(4), "dp").requires_grad_(True)
    f(x).sum().backward()
    assert type(x.grad) is NoRepr
'''


class TestClassify(unittest.TestCase):
    def test_groups(self):
        from torch_subclass_rt import compare

        self.assertEqual(compare.classify("passed", "failed"), compare.BROKEN)
        self.assertEqual(compare.classify("passed", "error"), compare.BROKEN)
        self.assertEqual(compare.classify("failed", "passed"), compare.FIXED)
        self.assertEqual(compare.classify("error", "passed"), compare.FIXED)
        for pair in (("passed", "skipped"), ("xfailed", "xpassed"), ("absent", "passed"),
                     ("failed", "skipped")):
            self.assertEqual(compare.classify(*pair), compare.CHANGED, pair)


class TestCompare(unittest.TestCase):
    def run_compare(self, suite_source: str, tmp: Path, *extra: str,
                    pytest_extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        (tmp / "test_suite.py").write_text(textwrap.dedent(suite_source))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        for var in ("TSRT_COMPARE_INSTALL", "TSRT_COMPARE_REPORT", "TSRT_MODE"):
            env.pop(var, None)
        return subprocess.run(
            [sys.executable, "-m", "torch_subclass_rt", "compare", "--quiet", "--keep",
             str(tmp / "runs"), *extra, "--", "-q", *pytest_extra, "test_suite.py"],
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
            # what install() breaks is reported apart from what it fixes
            broken, fixed = out.split("  broken by install() (2):")[1].split("  fixed by install() (1):")
            self.assertIn("test_only_stock_passes", broken)
            self.assertIn("test_subprocess_is_installed_too", broken)
            self.assertIn("test_only_installed_passes", fixed)
            self.assertNotIn("changed otherwise", out)
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

    def test_only_fixes_exits_zero(self):
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            proc = self.run_compare(ONLY_FIXES, tmp)
            out = proc.stdout
            self.assertEqual(proc.returncode, 0, out + proc.stderr)
            self.assertIn("1 test(s) differ (stock -> with install()):", out)
            self.assertIn("  fixed by install() (1):", out)
            self.assertIn("test_suite.py::test_fixed_by_install: failed -> passed", out)
            self.assertIn("stock: RuntimeError: a torch bug install() carries the fix for", out)
            self.assertNotIn("broken by install()", out)
            self.assertIn("install() only fixes tests here; it breaks none", out)

    def test_subclass_without_repr_is_fixed_on_every_release(self):
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            # with pytest's log capture, which hands torch's structured trace
            # a handler: stock torch formats the metadata for tlparse and
            # fails on every release (issue 152183); install() fixes it
            proc = self.run_compare(NO_REPR, tmp)
            out = proc.stdout
            self.assertEqual(proc.returncode, 0, out + proc.stderr)
            self.assertIn("  fixed by install() (1):", out)
            self.assertIn("test_train_no_repr_subclass: failed -> passed", out)
            self.assertIn("stock: BackendCompilerFailed", out)

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
