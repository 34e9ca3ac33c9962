"""Tests of tools/run_matrix.py: installs retried one at a time, tests run
without touching the network, a session that never installed is reported.

No nox is run: the subprocess runner is a fake that records each command.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tempfile
import threading
import unittest
import unittest.mock
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tools import run_matrix  # noqa: E402


class ScriptedRun:
    """Stands in for subprocess.run: answers each call with the next exit
    code of its session's script and records (session, command, env)."""

    def __init__(self, codes: dict[str, list[int]]):
        self.codes = {k: list(v) for k, v in codes.items()}
        self.calls: list[tuple[str, list[str], dict | None]] = []
        self.lock = threading.Lock()

    def __call__(self, cmd, cwd=None, stdout=None, stderr=None, env=None):
        session = cmd[cmd.index("-s") + 1]
        with self.lock:
            self.calls.append((session, list(cmd), env))
            rc = self.codes[session].pop(0)
        if stdout is not None:
            stdout.write(f"output of {' '.join(cmd[3:])}\n")
        return subprocess.CompletedProcess(cmd, rc)


class RunMatrixTestCase(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.log_dir = Path(tmp.name)
        self.lock = threading.Lock()
        out = unittest.mock.patch("sys.stdout", new_callable=io.StringIO)
        self.stdout = out.start()
        self.addCleanup(out.stop)
        self.sleeps: list[float] = []

    def install(self, run, session="tests(torch='2.11.0')", **kw):
        return run_matrix.install_session(
            session, self.log_dir, self.lock, run=run, sleep=self.sleeps.append, **kw)


class TestInstallSession(RunMatrixTestCase):
    def test_retries_until_an_attempt_succeeds(self):
        run = ScriptedRun({"tests(torch='2.11.0')": [1, 1, 0]})
        self.assertTrue(self.install(run))
        self.assertEqual(len(run.calls), 3)
        for _, cmd, _ in run.calls:
            self.assertEqual(cmd[-1], "--install-only")
        # backoff doubles between tries
        self.assertEqual(self.sleeps, [run_matrix.INSTALL_BACKOFF_S, 2 * run_matrix.INSTALL_BACKOFF_S])
        log = (self.log_dir / "tests-torch-2.11.0.install.log").read_text()
        self.assertIn("install attempt 1/4", log)
        self.assertIn("install attempt 3/4", log)

    def test_gives_up_after_the_last_attempt_and_prints_the_log(self):
        run = ScriptedRun({"tests(torch='2.11.0')": [1] * 4})
        self.assertFalse(self.install(run))
        self.assertEqual(len(run.calls), run_matrix.INSTALL_ATTEMPTS)
        self.assertEqual(len(self.sleeps), run_matrix.INSTALL_ATTEMPTS - 1)
        printed = self.stdout.getvalue()
        self.assertIn("install FAILED 4 times", printed)
        self.assertIn("output of -s tests(torch='2.11.0') --install-only", printed)

    def test_pip_resumes_broken_downloads(self):
        run = ScriptedRun({"tests(torch='2.11.0')": [0]})
        with unittest.mock.patch.dict("os.environ", {}, clear=False) as environ:
            environ.pop("PIP_RESUME_RETRIES", None)
            self.install(run)
        env = run.calls[0][2]
        self.assertEqual(env["PIP_RESUME_RETRIES"], run_matrix.PIP_ENV["PIP_RESUME_RETRIES"])
        self.assertEqual(env["PIP_RETRIES"], run_matrix.PIP_ENV["PIP_RETRIES"])

    def test_environment_settings_win_over_ours(self):
        run = ScriptedRun({"tests(torch='2.11.0')": [0]})
        with unittest.mock.patch.dict("os.environ", {"PIP_RESUME_RETRIES": "3"}):
            self.install(run)
        self.assertEqual(run.calls[0][2]["PIP_RESUME_RETRIES"], "3")


class TestRunMatrix(RunMatrixTestCase):
    SESSIONS = ["tests(torch='2.11.0')", "tests(torch='2.13.0')", "tests(torch='2.14.1')"]

    def matrix(self, run, jobs=2):
        install = lambda s, d, l: run_matrix.install_session(  # noqa: E731
            s, d, l, run=run, sleep=self.sleeps.append)
        test = lambda s, d, l: run_matrix.run_session(s, d, l, run=run)  # noqa: E731
        return run_matrix.run_matrix(self.SESSIONS, self.log_dir, self.lock, jobs,
                                     install=install, test=test)

    def test_tests_run_without_installing(self):
        run = ScriptedRun({s: [0, 0] for s in self.SESSIONS})
        results = self.matrix(run)
        self.assertEqual([(s, rc) for s, rc, _ in results], [(s, 0) for s in self.SESSIONS])
        installs = [c for s, c, _ in run.calls if c[-1] == "--install-only"]
        tests = [c for s, c, _ in run.calls if c[-1] == "--no-install"]
        self.assertEqual(len(installs), 3)
        self.assertEqual(len(tests), 3)
        # installs go one after another in the given order
        self.assertEqual([c[c.index("-s") + 1] for c in installs], self.SESSIONS)

    def test_a_session_that_never_installed_is_failed_and_not_tested(self):
        codes = {s: [0, 0] for s in self.SESSIONS}
        codes["tests(torch='2.13.0')"] = [1] * run_matrix.INSTALL_ATTEMPTS
        run = ScriptedRun(codes)
        results = self.matrix(run)
        self.assertEqual([rc for _, rc, _ in results], [0, run_matrix.INSTALL_FAILED, 0])
        self.assertFalse(any(s == "tests(torch='2.13.0')" and c[-1] == "--no-install"
                             for s, c, _ in run.calls))

    def test_exit_status_is_1_when_an_install_failed(self):
        with unittest.mock.patch.object(
            run_matrix, "run_matrix",
            return_value=[("tests(torch='2.11.0')", 0, 1.0),
                          ("tests(torch='2.13.0')", run_matrix.INSTALL_FAILED, 0.0)],
        ):
            self.assertEqual(run_matrix.main(["tests(torch='2.11.0')", "tests(torch='2.13.0')"]), 1)
        self.assertIn("NOT INSTALLED tests(torch='2.13.0')", self.stdout.getvalue())


if __name__ == "__main__":
    unittest.main()
