#!/usr/bin/env python3
"""Run the nox test matrix with several sessions at a time.

    python3 tools/run_matrix.py [-j JOBS] [SESSION ...]

Each ``tests(torch=...)`` session is one pytest process at a time, which
keeps one core busy; on the 2-core CI machine two sessions side by side take
about half the wall time of ``python3 -m nox``, which runs them one after
another. The sessions share nothing (each has its own virtualenv, its own
Inductor cache under ``.nox/<session>/tmp`` and, for the demo, free ports
picked by the OS), so running them together changes no result.

Installing and testing are two phases per session. Installs run one at a
time (``nox --install-only``), each retried up to :data:`INSTALL_ATTEMPTS`
times with pip told to resume broken downloads: the CUDA wheels of torch,
triton and the nvidia libraries come to several GB per release, and one
dropped connection must not fail a 25-minute matrix. One at a time, so a
later session finds the wheels an earlier one put in pip's cache. A session's
tests (``nox --no-install``, no network) start as soon as its install is done,
while the next session installs.

Sessions start longest first (the order of :data:`LONGEST_FIRST`, then the
rest as ``nox --list`` gives them); each one's output goes to
``.nox/matrix-logs/<session>.log`` (its installs to ``<session>.install.log``)
and is printed whole when it ends, so logs never interleave. Exit status 1
if any session failed, to install or to test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
#: sessions known to take longest (backport suite + ablation + series check)
LONGEST_FIRST = ("tests(torch='2.11.0')", "tests(torch='2.10.0')", "tests(torch='2.13.0')")
#: tries of one session's install before the session counts as failed
INSTALL_ATTEMPTS = 4
#: seconds before the second try; doubled before each later one
INSTALL_BACKOFF_S = 30.0
#: pip settings for installs, unless the environment sets them already:
#: resume a download cut short (pip's default gives up after 5 resumes, which
#: a 200 MB triton wheel on a flaky link can exhaust) and retry connections
PIP_ENV = {"PIP_RESUME_RETRIES": "50", "PIP_RETRIES": "10"}
#: the result code of a session whose install never succeeded
INSTALL_FAILED = -1


def default_sessions() -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "nox", "--list", "--json"],
        cwd=REPO_ROOT, check=True, capture_output=True, text=True,
    ).stdout
    # only the default sessions (nox.options.sessions), as plain `nox` runs
    listed = [s["session"] for s in json.loads(out) if s["name"] == "tests"]
    first = [s for s in LONGEST_FIRST if s in listed]
    return first + [s for s in listed if s not in first]


def _log_path(log_dir: Path, session: str, suffix: str) -> Path:
    return log_dir / (re.sub(r"[^A-Za-z0-9.]+", "-", session).strip("-") + suffix)


def install_session(
    session: str,
    log_dir: Path,
    print_lock: threading.Lock,
    attempts: int = INSTALL_ATTEMPTS,
    backoff_s: float = INSTALL_BACKOFF_S,
    run=subprocess.run,
    sleep=time.sleep,
) -> bool:
    """Create the session's virtualenv and install into it, retrying; True
    once an attempt succeeds. Every attempt's output goes to one log, and the
    log is printed whole if the last attempt fails."""
    log = _log_path(log_dir, session, ".install.log")
    env = {**PIP_ENV, **os.environ}
    log.write_text("")
    for attempt in range(1, attempts + 1):
        start = time.monotonic()
        with open(log, "a") as fh:
            fh.write(f"----- install attempt {attempt}/{attempts}\n")
            fh.flush()
            rc = run(
                [sys.executable, "-m", "nox", "-s", session, "--install-only"],
                cwd=REPO_ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env,
            ).returncode
        took = time.monotonic() - start
        # a full disk reads like a network error in pip's output ("not
        # enough bytes received"); say which it was
        free = f"; {shutil.disk_usage(REPO_ROOT).free / 2**30:.1f} GiB free" if rc else ""
        with print_lock:
            print(f"----- {session}: install attempt {attempt}/{attempts} "
                  f"{'ok' if rc == 0 else f'failed (exit {rc})'} in {took / 60:.1f} min{free}",
                  flush=True)
        if rc == 0:
            return True
        if attempt < attempts:
            sleep(backoff_s * 2 ** (attempt - 1))
    with print_lock:
        print(f"===== {session}: install FAILED {attempts} times; log {log}", flush=True)
        sys.stdout.write(log.read_text(errors="replace"))
        sys.stdout.flush()
    return False


def run_session(session: str, log_dir: Path, print_lock: threading.Lock, run=subprocess.run) -> tuple[str, int, float]:
    """Run the session's tests in the virtualenv its install phase made;
    --no-install: nothing is fetched here."""
    log = _log_path(log_dir, session, ".log")
    start = time.monotonic()
    with open(log, "w") as fh:
        rc = run(
            [sys.executable, "-m", "nox", "-s", session, "--no-install"],
            cwd=REPO_ROOT, stdout=fh, stderr=subprocess.STDOUT,
        ).returncode
    took = time.monotonic() - start
    with print_lock:
        print(f"===== {session}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} "
              f"in {took / 60:.1f} min; log {log}", flush=True)
        sys.stdout.write(log.read_text(errors="replace"))
        sys.stdout.flush()
    return session, rc, took


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                    help="sessions at a time (default: the number of cores)")
    ap.add_argument("sessions", nargs="*", help="default: every tests session")
    args = ap.parse_args(argv)
    sessions = args.sessions or default_sessions()
    log_dir = REPO_ROOT / ".nox" / "matrix-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    start = time.monotonic()
    results = run_matrix(sessions, log_dir, lock, args.jobs)
    print(f"\nmatrix: {len(results)} sessions, {args.jobs} at a time, "
          f"{(time.monotonic() - start) / 60:.1f} min")
    for session, rc, took in results:
        state = "ok    " if rc == 0 else "FAILED" if rc != INSTALL_FAILED else "NOT INSTALLED"
        print(f"  {state} {session} ({took / 60:.1f} min)")
    return 0 if all(rc == 0 for _, rc, _ in results) else 1


def run_matrix(
    sessions: list[str], log_dir: Path, lock: threading.Lock, jobs: int,
    install=install_session, test=run_session,
) -> list[tuple[str, int, float]]:
    """Install the sessions one after another; each one's tests go to a pool
    of ``jobs`` workers as soon as its install is done. Results in the order
    of ``sessions``."""
    futures = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for session in sessions:
            if install(session, log_dir, lock):
                futures[session] = pool.submit(test, session, log_dir, lock)
    return [futures[s].result() if s in futures else (s, INSTALL_FAILED, 0.0) for s in sessions]


if __name__ == "__main__":
    sys.exit(main())
