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
dropped connection must not fail a 25-minute matrix. A session's tests
(``nox --no-install``, no network) start as soon as its install is done,
while another session installs.

Each virtualenv of a CUDA build takes about 5 GB. With ``--discard-venvs``
(CI: a fresh clone never reuses them) a session's virtualenv is removed as
soon as its tests end, pip keeps no cache, and an install waits until
:data:`INSTALL_NEEDS_GIB` are free on the disk or no other session holds a
virtualenv: the disk is shared, and an install that fills it fails the
matrix (stop 18's CI run: "No space left on device" installing the fifth
torch while four virtualenvs sat finished). Without the flag the
virtualenvs stay for reuse (``nox -r``) and installs do not wait.

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
#: at most this many lines of a failed session's log are repeated at the end
FAILURE_LINES = 15
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
#: free space an install waits for (--discard-venvs) while another session
#: holds a virtualenv: a CUDA build's virtualenv (4.7-5.5 GB for torch
#: 2.10-2.14) plus pip's temporary copy of the wheels it unpacks
INSTALL_NEEDS_GIB = 9.0
#: seconds between looks at the disk while an install waits
DISK_POLL_S = 15.0


def venv_dir(session: str) -> Path:
    """The virtualenv nox makes for ``session`` (nox's own naming:
    non-word characters to dashes, lower case)."""
    name = re.sub(r"[^\w\s-]", "-", session).strip().lower()
    return REPO_ROOT / ".nox" / re.sub(r"[-\s]+", "-", name).strip("-")


def free_gib() -> float:
    return shutil.disk_usage(REPO_ROOT).free / 2**30


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


#: lines of a session's log that say what failed: pytest's failed and
#: erroring tests and its count line, nox's failed command, the ablation's
#: unguarded points, the instruction gate's and verify_patches' verdicts
_FAILURE_LINE = re.compile(
    r"^(FAILED|ERROR) |^UNGUARDED |failed with exit code|instruction gate FAILED|^FAILED: "
    r"|^=* ?\d+ (failed|errors?)\b.* in [\d.]+s"
)


def failure_lines(log: Path, limit: int = FAILURE_LINES) -> list[str]:
    """The lines of ``log`` that say what failed (the last ``limit`` of
    them), else its last ``limit`` lines."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError as e:
        return [f"(no log: {e})"]
    hits = [line for line in lines if _FAILURE_LINE.search(line)]
    return [line[:300] for line in (hits or lines)[-limit:]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                    help="sessions at a time (default: the number of cores)")
    ap.add_argument("--discard-venvs", action="store_true",
                    help="remove each session's virtualenv when its tests end, keep no pip "
                         f"cache, and start an install only with {INSTALL_NEEDS_GIB:g} GiB "
                         "free or no other virtualenv on disk (CI)")
    ap.add_argument("sessions", nargs="*", help="default: every tests session")
    args = ap.parse_args(argv)
    if args.discard_venvs:
        # downloads would otherwise stay in ~/.cache/pip beside the venvs
        os.environ.setdefault("PIP_NO_CACHE_DIR", "1")
    sessions = args.sessions or default_sessions()
    log_dir = REPO_ROOT / ".nox" / "matrix-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    start = time.monotonic()
    results = run_matrix(sessions, log_dir, lock, args.jobs,
                         gate=DiskGate() if args.discard_venvs else None)
    print(f"\nmatrix: {len(results)} sessions, {args.jobs} at a time, "
          f"{(time.monotonic() - start) / 60:.1f} min")
    for session, rc, took in results:
        state = "ok    " if rc == 0 else "FAILED" if rc != INSTALL_FAILED else "NOT INSTALLED"
        print(f"  {state} {session} ({took / 60:.1f} min)")
    # CI shows only the end of this output, and a failed session's log was
    # printed whole when it ended, maybe an hour of output earlier
    for session, rc, _took in results:
        if rc not in (0, INSTALL_FAILED):
            log = _log_path(log_dir, session, ".log")
            print(f"\nwhy {session} failed (from {log}):")
            print("\n".join(f"  {line}" for line in failure_lines(log)))
    return 0 if all(rc == 0 for _, rc, _ in results) else 1


class DiskGate:
    """Holds an install back while the disk has less than ``needs_gib``
    free and another session still has its virtualenv; removes a session's
    virtualenv when the session is done with it."""

    def __init__(self, needs_gib: float = INSTALL_NEEDS_GIB, free=free_gib,
                 discard=lambda s: shutil.rmtree(venv_dir(s), ignore_errors=True),
                 poll_s: float = DISK_POLL_S):
        self.needs_gib, self.free, self.discard, self.poll_s = needs_gib, free, discard, poll_s
        self.holding = 0
        self.cond = threading.Condition()

    def before_install(self, session: str, print_lock: threading.Lock) -> None:
        with self.cond:
            said = False
            while self.holding and self.free() < self.needs_gib:
                if not said:
                    with print_lock:
                        print(f"----- {session}: waiting for another session's virtualenv to go "
                              f"({self.free():.1f} GiB free, an install needs {self.needs_gib:g})",
                              flush=True)
                    said = True
                # woken when a session lets go; polled too, as other
                # processes on the machine free space of their own
                self.cond.wait(self.poll_s)
            self.holding += 1

    def release(self, session: str) -> None:
        self.discard(session)
        with self.cond:
            self.holding -= 1
            self.cond.notify_all()


def run_matrix(
    sessions: list[str], log_dir: Path, lock: threading.Lock, jobs: int,
    install=install_session, test=run_session, gate: DiskGate | None = None,
) -> list[tuple[str, int, float]]:
    """Run ``jobs`` sessions at a time, each installing (one install at a
    time, in the order of ``sessions``) and then testing; with a ``gate``,
    an install waits for disk space and a session's virtualenv goes when it
    is done. Results in the order of ``sessions``."""
    # one install at a time, in the order of `sessions` even when a later
    # lane frees first: the next index may start only once this one's
    # install is over
    turn = threading.Condition()
    next_up = [0]

    def one(index: int, session: str) -> tuple[str, int, float]:
        with turn:
            turn.wait_for(lambda: next_up[0] == index)
        try:
            if gate is not None:
                gate.before_install(session, lock)
            installed = install(session, log_dir, lock)
        finally:
            with turn:
                next_up[0] += 1
                turn.notify_all()
        try:
            return test(session, log_dir, lock) if installed else (session, INSTALL_FAILED, 0.0)
        finally:
            if gate is not None:
                gate.release(session)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(one, i, s) for i, s in enumerate(sessions)]
        return [f.result() for f in futures]


if __name__ == "__main__":
    sys.exit(main())
