"""benchmarks/scaling.py runs end to end (tiny N; the figures are not checked:
timings are not tests), and --combine merges runs into one table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import harness

MODE = harness.setup_mode()

ROOT = Path(__file__).resolve().parents[1]
SCALING = str(ROOT / "benchmarks" / "scaling.py")


@unittest.skipIf(MODE not in ("backport", "native", "forced"), f"no benchmark mode for {MODE}")
class TestScalingBenchmark(unittest.TestCase):
    def run_script(self, *args):
        proc = subprocess.run(
            [sys.executable, SCALING, *args], capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return proc.stdout

    def test_runs_and_combines(self):
        with tempfile.TemporaryDirectory() as tmp:
            run = os.path.join(tmp, "run.json")
            plot = os.path.join(tmp, "plot.png")
            self.run_script("--mode", MODE, "--n", "1,2", "--calls", "5", "--repeats", "1",
                            "--opaques", "distinct", "--json", run)
            rows = json.loads(Path(run).read_text())
            self.assertEqual(
                sorted((r["n"], r["kind"]) for r in rows),
                [(1, "fwd"), (1, "fwd+bwd"), (2, "fwd"), (2, "fwd+bwd")],
            )
            for r in rows:
                self.assertTrue(r["config"].endswith(MODE), r["config"])
                self.assertGreater(r["sub_us"], 0)
                self.assertGreater(r["plain_us"], 0)
                self.assertGreater(r["compile_sub_s"], 0)
            other = os.path.join(tmp, "other.json")
            Path(other).write_text(json.dumps([{**r, "config": "zz other"} for r in rows]))
            out = self.run_script("--combine", run, run, other, "--plot", plot)
            self.assertIn("ratios of each configuration to zz other", out)
            self.assertEqual(out.count("extra/in"), 4)
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                self.assertIn("matplotlib is not installed", out)
                self.assertFalse(os.path.exists(plot))
            else:
                self.assertTrue(os.path.getsize(plot) > 0)

    def test_compile_repeats_and_kinds(self):
        with tempfile.TemporaryDirectory() as tmp:
            run = os.path.join(tmp, "run.json")
            self.run_script("--mode", MODE, "--n", "2", "--calls", "3", "--repeats", "1",
                            "--opaques", "shared", "--kinds", "fwd+bwd", "--compile-repeats", "3",
                            "--json", run)
            (row,) = json.loads(Path(run).read_text())
            self.assertEqual((row["n"], row["kind"], row["opaques"]), (2, "fwd+bwd", "shared"))
            for variant in ("sub", "plain"):
                samples = row[f"compile_{variant}_samples"]
                self.assertEqual(len(samples), 3)
                self.assertEqual(row[f"compile_{variant}_s"], sorted(samples)[1])

    def test_bad_kind_is_refused(self):
        proc = subprocess.run(
            [sys.executable, SCALING, "--kinds", "bwd"], capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600,
        )
        self.assertEqual(proc.returncode, 2)
        self.assertIn("--kinds: fwd or fwd+bwd, got 'bwd'", proc.stderr)


if __name__ == "__main__":
    unittest.main()
