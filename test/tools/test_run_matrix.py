"""Tests of tools/run_matrix.py: installs retried one at a time, tests run
without touching the network, a session that never installed is reported,
and with --discard-venvs an install waits for disk space while another
session holds a virtualenv, which goes when its session ends.

No nox is run: the subprocess runner is a fake that records each command.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import unittest.mock
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
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

    def test_the_end_of_the_output_says_why_a_session_failed(self):
        # CI shows only the end of the output; the failed session's log was
        # printed whole long before (a 2.10 lane failed with nothing to show)
        with tempfile.TemporaryDirectory() as tmp:
            log_dir = Path(tmp) / ".nox" / "matrix-logs"
            log_dir.mkdir(parents=True)
            failed = "tests(torch='2.10.0')"
            run_matrix._log_path(log_dir, failed, ".log").write_text(
                "nox > step took 20.8 min: python -m pytest test\n"
                "FAILED test/points/test_x.py::TestX::test_y - AssertionError: 1 != 2\n"
                "= 1 failed, 429 passed, 22 skipped in 799.86s (0:13:19) =\n"
                + "noise\n" * 500
                + "nox > Command python -m pytest test failed with exit code 1\n"
            )
            with unittest.mock.patch.object(run_matrix, "REPO_ROOT", Path(tmp)), \
                    unittest.mock.patch.object(
                        run_matrix, "run_matrix",
                        return_value=[(failed, 1, 60.0), ("tests(torch='2.11.0')", 0, 1.0)]):
                self.assertEqual(run_matrix.main([failed, "tests(torch='2.11.0')"]), 1)
        tail = self.stdout.getvalue().splitlines()[-4:]
        self.assertEqual(
            tail[0], f"why {failed} failed (from {run_matrix._log_path(log_dir, failed, '.log')}):")
        self.assertIn("  FAILED test/points/test_x.py::TestX::test_y - AssertionError: 1 != 2", tail)
        self.assertIn("  = 1 failed, 429 passed, 22 skipped in 799.86s (0:13:19) =", tail)
        self.assertEqual(tail[-1], "  nox > Command python -m pytest test failed with exit code 1")

    def test_failure_lines_fall_back_to_the_end_of_the_log(self):
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "s.log"
            log.write_text("".join(f"line {i}\n" for i in range(40)))
            self.assertEqual(run_matrix.failure_lines(log, limit=3), ["line 37", "line 38", "line 39"])
            self.assertEqual(run_matrix.failure_lines(Path(tmp) / "none.log")[0][:9], "(no log: ")


class FakeDisk:
    """Free space that each live virtualenv takes ``venv_gib`` of; records
    what happened in order."""

    def __init__(self, total_gib: float, venv_gib: float):
        self.total, self.venv = total_gib, venv_gib
        self.live: set[str] = set()
        self.events: list[str] = []
        self.lock = threading.Lock()

    def free(self) -> float:
        with self.lock:
            return self.total - self.venv * len(self.live)

    def discard(self, session: str) -> None:
        with self.lock:
            self.live.discard(session)
            self.events.append(f"discard {session}")


class TestDiskGate(RunMatrixTestCase):
    SESSIONS = ["tests(torch='2.11.0')", "tests(torch='2.10.0')", "tests(torch='2.13.0')"]

    def matrix(self, disk, needs_gib=9.0, test_codes=None, hold_first=False):
        codes = test_codes or {}
        peak = [0]

        def install(s, d, l):
            with disk.lock:
                disk.live.add(s)
                peak[0] = max(peak[0], len(disk.live))
                disk.events.append(f"install {s}")
            return codes.get(s, (True, 0))[0]

        def test(s, d, l):
            if hold_first and s == self.SESSIONS[0]:
                # the next install must find this session's virtualenv on disk
                deadline = time.monotonic() + 5
                while "waiting for another" not in self.stdout.getvalue() and time.monotonic() < deadline:
                    time.sleep(0.005)
            with disk.lock:
                disk.events.append(f"test {s}")
            return s, codes.get(s, (True, 0))[1], 0.0

        gate = run_matrix.DiskGate(needs_gib, free=disk.free, discard=disk.discard, poll_s=0.01)
        results = run_matrix.run_matrix(self.SESSIONS, self.log_dir, self.lock, 2,
                                        install=install, test=test, gate=gate)
        return results, peak[0]

    def test_venv_dir_is_the_one_nox_makes(self):
        self.assertEqual(run_matrix.venv_dir("tests(torch='2.11.0')"),
                         REPO / ".nox" / "tests-torch-2-11-0")
        self.assertEqual(run_matrix.venv_dir("bench"), REPO / ".nox" / "bench")

    def test_an_install_waits_for_another_sessions_venv_to_go(self):
        # room for one virtualenv only: sessions go one after another
        disk = FakeDisk(total_gib=12.0, venv_gib=5.0)
        results, peak = self.matrix(disk, hold_first=True)
        self.assertEqual([rc for _, rc, _ in results], [0, 0, 0])
        self.assertEqual(peak, 1)
        self.assertEqual(disk.live, set())
        for s in self.SESSIONS:
            i = disk.events.index(f"install {s}")
            self.assertEqual(disk.events[i:i + 3], [f"install {s}", f"test {s}", f"discard {s}"])
        self.assertIn("waiting for another session's virtualenv to go", self.stdout.getvalue())

    def test_with_room_two_sessions_hold_venvs_at_once(self):
        disk = FakeDisk(total_gib=100.0, venv_gib=5.0)
        results, peak = self.matrix(disk)
        self.assertEqual([rc for _, rc, _ in results], [0, 0, 0])
        self.assertLessEqual(peak, 2)
        self.assertEqual(disk.live, set())
        installs = [e for e in disk.events if e.startswith("install")]
        self.assertEqual(installs, [f"install {s}" for s in self.SESSIONS])

    def test_a_lone_install_goes_ahead_on_a_full_disk(self):
        # nothing to wait for: the install tries, and says how much was free if it fails
        disk = FakeDisk(total_gib=1.0, venv_gib=5.0)
        results, _ = self.matrix(disk)
        self.assertEqual([rc for _, rc, _ in results], [0, 0, 0])

    def test_a_failed_install_discards_its_venv_and_is_not_tested(self):
        disk = FakeDisk(total_gib=12.0, venv_gib=5.0)
        results, _ = self.matrix(disk, test_codes={"tests(torch='2.10.0')": (False, 0)})
        self.assertEqual([rc for _, rc, _ in results], [0, run_matrix.INSTALL_FAILED, 0])
        self.assertNotIn("test tests(torch='2.10.0')", disk.events)
        self.assertIn("discard tests(torch='2.10.0')", disk.events)
        self.assertEqual(disk.live, set())

    def test_a_failed_session_still_lets_go_of_its_venv(self):
        disk = FakeDisk(total_gib=12.0, venv_gib=5.0)
        results, _ = self.matrix(disk, test_codes={"tests(torch='2.11.0')": (True, 1)})
        self.assertEqual([rc for _, rc, _ in results], [1, 0, 0])
        self.assertEqual(disk.live, set())

    def test_discard_venvs_flag_turns_off_pips_cache(self):
        with unittest.mock.patch.object(run_matrix, "run_matrix", return_value=[]) as rm, \
                unittest.mock.patch.dict("os.environ", {}) as environ:
            environ.pop("PIP_NO_CACHE_DIR", None)
            run_matrix.main(["--discard-venvs", "tests(torch='2.11.0')"])
            self.assertEqual(environ.get("PIP_NO_CACHE_DIR"), "1")
        self.assertIsInstance(rm.call_args.kwargs["gate"], run_matrix.DiskGate)
        with unittest.mock.patch.object(run_matrix, "run_matrix", return_value=[]) as rm:
            run_matrix.main(["tests(torch='2.11.0')"])
        self.assertIsNone(rm.call_args.kwargs["gate"])


class TestMatrixCoversReleases(unittest.TestCase):
    def test_every_release_install_supports_has_a_session(self):
        # a release added to install()'s tables (a .0 that lacks the fixes
        # its patch release carries) must be tested by the matrix too
        from test_packaging import _matrix_versions

        from torch_subclass_rt import _torch_compat as compat

        supported = {*compat.BACKPORT_VERSIONS, *compat.FORCED_VERSIONS, *compat.FIXES_VERSIONS}
        self.assertEqual(supported - set(_matrix_versions()), set())


if __name__ == "__main__":
    unittest.main()
