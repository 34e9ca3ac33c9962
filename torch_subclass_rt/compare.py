"""``python -m torch_subclass_rt compare -- <pytest args>``.

Runs the user's own pytest suite twice, stock and with ``install()``, and
reports the tests whose outcome differs (Note [install() is transparent
without opaques] says there should be none for subclasses without opaques).

Each run is a fresh ``python -m pytest`` in its own work directory, with its
own ``TORCHINDUCTOR_CACHE_DIR`` (a compiled artefact of one run must not
serve the other) and pytest cache, and with
``-p torch_subclass_rt.pytest_plugin``, which records every test's outcome.
In the installed run ``install()`` happens in every Python process, not just
pytest's: the run's ``PYTHONPATH`` starts with a directory holding a
``sitecustomize.py`` that installs when ``TSRT_COMPARE_INSTALL`` is set and
then runs whatever ``sitecustomize`` it shadows, so pytest-xdist workers and
tests that spawn subprocesses (multiprocessing, torch.distributed launchers)
are installed too.

A test whose outcome differs is reported in one of three groups:
*broken by install()* (passed stock, failed or errored with it), *fixed by
install()* (failed or errored stock, passed with it: a torch bug outside
the feature that ``install()`` carries the fix for on every graph, Note
[Scope of the fixes outside the feature] in points/lazy_log_and_donated_buffers.py), and *changed
otherwise* (a skip, an xfail that passes, a test only one run collected).

Exit status: 0 when every test has the same outcome in both runs or the
only differences are tests install() fixes, 1 when install() breaks or
otherwise changes a test, 2 when a run left no outcomes (pytest could not
start).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

INSTALL_ENV = "TSRT_COMPARE_INSTALL"
REPORT_ENV = "TSRT_COMPARE_REPORT"


def install_from_env() -> None:
    """install() as ``TSRT_COMPARE_INSTALL`` says (no-op when unset)."""
    how = os.environ.get(INSTALL_ENV, "").strip()
    if not how:
        return
    words = set(how.split("+"))
    if not words or not words <= {"1", "force", "dtensor"}:
        raise RuntimeError(
            f"{INSTALL_ENV}={how!r}: expected '1' or 'force', optionally with '+dtensor' "
            "(e.g. '1+dtensor')"
        )
    import torch_subclass_rt

    torch_subclass_rt.install(force="force" in words, dtensor="dtensor" in words)

_SITECUSTOMIZE = '''\
# Written by python -m torch_subclass_rt compare: install() in every process
# of the installed run, then the sitecustomize this one shadows (if any).
import os as _os
import sys as _sys

if _os.environ.get("TSRT_COMPARE_INSTALL"):
    from torch_subclass_rt.compare import install_from_env as _install

    _install()

_here = _os.path.dirname(_os.path.abspath(__file__))
_saved_path = list(_sys.path)
_sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
_me = _sys.modules.pop("sitecustomize", None)
try:
    import sitecustomize  # noqa: F401  (the shadowed one)
except ImportError:
    pass
finally:
    _sys.path[:] = _saved_path
    if _me is not None:
        _sys.modules["sitecustomize"] = _me
'''

ARMS = ("stock", "installed")

#: how an outcome changed from the stock run to the installed one
BROKEN = "broken by install()"
FIXED = "fixed by install()"
CHANGED = "changed otherwise"
GROUPS = (BROKEN, FIXED, CHANGED)
_FAILING = ("failed", "error")


def classify(stock_outcome: str, installed_outcome: str) -> str:
    """The group of a test whose outcome differs between the runs."""
    if stock_outcome == "passed" and installed_outcome in _FAILING:
        return BROKEN
    if stock_outcome in _FAILING and installed_outcome == "passed":
        return FIXED
    return CHANGED


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--force", action="store_true",
        help="installed run: install(force=True) (torch 2.13: our runtime replaces torch's)",
    )
    parser.add_argument(
        "--dtensor", action="store_true",
        help="installed run: install(dtensor=True) (DTensor's mesh as an inner attr, torch 2.11)",
    )
    parser.add_argument(
        "--keep", metavar="DIR",
        help="keep the runs' work directories (outcomes, logs, inductor caches) under DIR",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="do not show pytest's output while it runs",
    )
    parser.add_argument(
        "--parallel", action="store_true",
        help="run the two arms at the same time (each is one pytest process: on a "
        "machine with two free cores this halves the wall time); implies --quiet",
    )
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER,
                        help="arguments for pytest, after --")


def _run_arm(
    arm: str, workdir: Path, pytest_args: list[str], force: bool, quiet: bool, dtensor: bool = False
) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    report = workdir / "outcomes.json"
    env = dict(os.environ)
    env.pop(INSTALL_ENV, None)
    env[REPORT_ENV] = str(report)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(workdir / "inductor-cache")
    # pytest's output reaches us through a pipe: show it as it comes
    env.setdefault("PYTHONUNBUFFERED", "1")
    # the package itself must be importable in every process of the run
    package_root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if package_root not in paths:
        paths.append(package_root)
    if arm == "installed":
        shim = workdir / "site"
        shim.mkdir(exist_ok=True)
        (shim / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        paths.insert(0, str(shim))
        env[INSTALL_ENV] = ("force" if force else "1") + ("+dtensor" if dtensor else "")
    env["PYTHONPATH"] = os.pathsep.join(paths)
    cmd = [
        sys.executable, "-m", "pytest",
        "-p", "torch_subclass_rt.pytest_plugin",
        "-o", f"cache_dir={workdir / 'pytest-cache'}",
        *pytest_args,
    ]
    print(f"== {arm}: {' '.join(cmd[1:])}", flush=True)
    with open(workdir / "pytest.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if not quiet:
                sys.stdout.write(line)
        proc.wait()
    print(f"== {arm}: pytest exited with {proc.returncode}", flush=True)
    if not report.exists():
        return {}
    return json.loads(report.read_text())


def _counts(outcomes: dict) -> str:
    c = Counter(o for o, _ in outcomes.values())
    return ", ".join(f"{n} {k}" for k, n in sorted(c.items())) or "no tests"


def compare(pytest_args: list[str], *, force: bool = False, keep: str | None = None,
            quiet: bool = False, parallel: bool = False, dtensor: bool = False) -> int:
    if pytest_args and pytest_args[0] == "--":
        pytest_args = pytest_args[1:]
    with tempfile.TemporaryDirectory(prefix="tsrt-compare-") as tmp:
        base = Path(keep).resolve() if keep else Path(tmp)
        if parallel:
            # the arms share nothing (work directory, inductor cache, pytest
            # cache, report); interleaved pytest output would be unreadable
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(len(ARMS)) as pool:
                futures = {
                    arm: pool.submit(_run_arm, arm, base / arm, pytest_args, force, True, dtensor)
                    for arm in ARMS
                }
                results = {arm: f.result() for arm, f in futures.items()}
        else:
            results = {arm: _run_arm(arm, base / arm, pytest_args, force, quiet, dtensor) for arm in ARMS}
        for arm in ARMS:
            print(f"{arm}: {_counts(results[arm])}")
        missing = [arm for arm in ARMS if not results[arm]]
        if missing:
            print(f"no test outcomes from the {' and '.join(missing)} run "
                  f"(see pytest's output above{'; logs under ' + keep if keep else ''})")
            return 2
        stock, installed = results["stock"], results["installed"]
        differ = sorted(
            n for n in set(stock) | set(installed)
            if (stock.get(n) or ["absent"])[0] != (installed.get(n) or ["absent"])[0]
        )
        if not differ:
            print(f"same outcome for all {len(stock)} tests, stock and with install()")
            return 0
        groups: dict[str, list[str]] = {g: [] for g in GROUPS}
        for n in differ:
            s_out = (stock.get(n) or ["absent"])[0]
            i_out = (installed.get(n) or ["absent"])[0]
            groups[classify(s_out, i_out)].append(n)
        print(f"{len(differ)} test(s) differ (stock -> with install()):")
        for group, names in groups.items():
            if not names:
                continue
            print(f"  {group} ({len(names)}):")
            for n in names:
                s_out, s_why = stock.get(n) or ["absent", ""]
                i_out, i_why = installed.get(n) or ["absent", ""]
                print(f"    {n}: {s_out} -> {i_out}")
                for arm, why in (("stock", s_why), ("installed", i_why)):
                    if why:
                        print(f"        {arm}: {why}")
        if groups[BROKEN] or groups[CHANGED]:
            return 1
        print("install() only fixes tests here; it breaks none")
        return 0
