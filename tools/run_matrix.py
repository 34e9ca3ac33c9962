#!/usr/bin/env python3
"""Run the nox test matrix with several sessions at a time.

    python3 tools/run_matrix.py [-j JOBS] [SESSION ...]

Each ``tests(torch=...)`` session is one pytest process at a time, which
keeps one core busy; on the 2-core CI machine two sessions side by side take
about half the wall time of ``python3 -m nox``, which runs them one after
another. The sessions share nothing (each has its own virtualenv, its own
Inductor cache under ``.nox/<session>/tmp`` and, for the demo, free ports
picked by the OS), so running them together changes no result.

Sessions start longest first (the order of :data:`LONGEST_FIRST`, then the
rest as ``nox --list`` gives them); each one's output goes to
``.nox/matrix-logs/<session>.log`` and is printed whole when it ends, so
logs never interleave. Exit status 1 if any session failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
#: sessions known to take longest (backport suite + ablation + series check)
LONGEST_FIRST = ("tests(torch='2.11.0')", "tests(torch='2.13.0')")


def default_sessions() -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "nox", "--list", "--json"],
        cwd=REPO_ROOT, check=True, capture_output=True, text=True,
    ).stdout
    # only the default sessions (nox.options.sessions), as plain `nox` runs
    listed = [s["session"] for s in json.loads(out) if s["name"] == "tests"]
    first = [s for s in LONGEST_FIRST if s in listed]
    return first + [s for s in listed if s not in first]


def run_session(session: str, log_dir: Path, print_lock: threading.Lock) -> tuple[str, int, float]:
    log = log_dir / (re.sub(r"[^A-Za-z0-9.]+", "-", session).strip("-") + ".log")
    start = time.monotonic()
    with open(log, "w") as fh:
        rc = subprocess.run(
            [sys.executable, "-m", "nox", "-s", session],
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
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda s: run_session(s, log_dir, lock), sessions))
    print(f"\nmatrix: {len(results)} sessions, {args.jobs} at a time, "
          f"{(time.monotonic() - start) / 60:.1f} min")
    for session, rc, took in results:
        print(f"  {'ok    ' if rc == 0 else 'FAILED'} {session} ({took / 60:.1f} min)")
    return 0 if all(rc == 0 for _, rc, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
