#!/usr/bin/env python3
"""Every patch point earns its place: drop it, and its ``guarded_by`` tests fail.

For the running torch and a mode (``backport`` on 2.11, ``forced`` on 2.13,
``native+fixes`` on 2.12.1 / 2.13.0 / 2.14.1: the upstream-fix points),
this tool

1. checks that every test named in a point's ``guarded_by`` exists and passes
   with all points installed (one pytest run over all of them);
2. for each point (or each ``--point``/``--group`` given), runs only that
   point's ``guarded_by`` tests in a fresh process with the point left out of
   ``install()`` (``TSRT_EXCLUDE_POINTS``, see ``torch_subclass_rt.install``)
   and a fresh, empty Inductor/AOTAutograd cache directory;
3. reports points whose tests still pass when the point is gone (unguarded),
   points that name no test at all, and named tests that do not exist or do not
   pass with every point installed. Exit status 1 if there is any.

A test only counts as guarding a point if it *fails* (or errors) when the point
is dropped: a test that passes or is skipped then does not guard it. One
``guarded_by`` serves every torch and mode the point is installed for, so it may
name tests that skip on this torch/mode (a forced-mode-only test, say; those
are left out here) or that guard it only in another mode (a backport test of
a runtime function passes on 2.13, whose own function is correct, when forced
mode leaves ours out). So a point is guarded here if at least one of its tests
that run fails without it; the others are listed as notes.

``--discover FILE_OR_NODE ...`` instead runs the given tests with each
selected point dropped and prints the ones that fail: a starting point for
filling ``guarded_by`` (never paste its output unreviewed: a test that fails
for an unrelated reason, or only by accident, guards nothing).

Usage (from the repository root, in the environment of the torch to check)::

    python tools/ablate_points.py                       # mode from TSRT_MODE / torch
    python tools/ablate_points.py --mode forced -j 2
    python tools/ablate_points.py --point aot_autograd.is_fun
    python tools/ablate_points.py --group library       # all "library.*" at once
    python tools/ablate_points.py --group dtensor       # the opt-in group "dtensor"
    python tools/ablate_points.py --discover test/runtime/test_opaque_subclass_attrs.py --point fake_tensors.is_fake
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: outcome of one test: "passed", "failed" (failure or error), "skipped";
#: a test the run did not report is "missing"
Outcomes = dict[str, str]
#: run(excluded point names, pytest node ids or files) -> outcomes by node id
Runner = Callable[[Sequence[str], Sequence[str]], Outcomes]


@dataclass
class Result:
    """One ablation: the points left out and what their tests did."""

    excluded: tuple[str, ...]
    #: the named tests that run on this torch/mode (see ablate())
    tests: tuple[str, ...]
    outcomes: Outcomes = field(default_factory=dict)

    @property
    def still_passing(self) -> list[str]:
        """Named tests that did not fail with the points left out."""
        return [t for t in self.tests if self.outcomes.get(t, "missing") != "failed"]

    @property
    def failing(self) -> list[str]:
        return [t for t in self.tests if self.outcomes.get(t) == "failed"]

    @property
    def guarded(self) -> bool:
        return bool(self.failing)


@dataclass
class Report:
    check: Outcomes
    results: list[Result]
    #: names of points that name no guarding test
    no_tests: list[str]

    @property
    def broken_tests(self) -> list[str]:
        """Named tests that are missing or fail with every point installed."""
        return sorted(t for t, o in self.check.items() if o not in ("passed", "skipped"))

    @property
    def unguarded(self) -> list[Result]:
        return [r for r in self.results if r.tests and not r.guarded]

    @property
    def ok(self) -> bool:
        return not (self.broken_tests or self.unguarded or self.no_tests)


def default_mode(version: str) -> str:
    from torch_subclass_rt import _torch_compat
    from torch_subclass_rt._modes import Mode

    mode = os.environ.get("TSRT_MODE", "").strip()
    if mode:
        return mode
    if version in _torch_compat.BACKPORT_VERSIONS:
        return Mode.BACKPORT
    return Mode.FORCED if version in _torch_compat.FORCED_VERSIONS else Mode.NATIVE_FIXES


def points_for(version: str, mode: str) -> list:
    from torch_subclass_rt.patching import registry
    from torch_subclass_rt.points import all_points

    points = all_points()
    # opt-in groups too (install(dtensor=True)): their tests install with
    # the group asked for, and an ablated point is left out there as well
    groups = {p.group for p in points if p.group}
    return registry.select(points, version, mode, groups)


def select_units(
    points: Sequence, names: Iterable[str] = (), groups: Iterable[str] = ()
) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """What to ablate: (point names left out together, tests they name).

    No names and no groups: every point on its own. A group is a torch
    subsystem, the first part of point names (``points.subsystem_of``:
    "library" selects every "library.*" point) or an opt-in group
    ("dtensor": every point with ``group="dtensor"``), ablated as one unit
    whose tests are the union of its points' tests.

    A point that requires a left-out one (``PatchPoint.requires``) is left
    out with it, as install() would refuse it alone; the unit's tests stay
    those of the points asked for.
    """
    from torch_subclass_rt.patching.registry import with_dependents

    by_name = {p.name: p for p in points}
    names, groups = list(names), list(groups)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SystemExit(
            f"no such point for this torch/mode: {', '.join(unknown)} "
            f"(points: {', '.join(by_name)})"
        )
    units: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    for group in groups:
        members = [
            p
            for p in points
            if p.name.startswith(group.rstrip(".") + ".") or getattr(p, "group", "") == group
        ]
        if not members:
            raise SystemExit(f"group {group!r} selects no point for this torch/mode")
        tests = tuple(dict.fromkeys(t for p in members for t in p.guarded_by))
        units.append((tuple(with_dependents([p.name for p in members], points)), tests))
    chosen = names if (names or groups) else list(by_name)
    units.extend((tuple(with_dependents([n], points)), tuple(by_name[n].guarded_by)) for n in chosen)
    return units


def ablate(
    points: Sequence,
    run: Runner,
    names: Iterable[str] = (),
    groups: Iterable[str] = (),
    jobs: int = 1,
    known: Outcomes | None = None,
) -> Report:
    """The check run and one run per unit (see :func:`select_units`).

    The check goes first into the same pool as the units rather than before
    them: it is the longest run (every named test), and on its own it left
    all but one of ``jobs`` idle. So a unit also runs the named tests the
    check then finds skipped on this torch/mode; those are dropped from its
    result afterwards, which gives the report a check-first run would.

    ``known``: outcomes of a run with every point installed that already
    happened (the session's suite, ``--check-junit``); the check runs only
    the named tests it lacks."""
    units = select_units(points, names, groups)
    named = list(dict.fromkeys(t for _, tests in units for t in tests))
    known = known or {}
    to_check = [t for t in named if t not in known]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        check_run = pool.submit(run, (), to_check) if to_check else None
        unit_runs = [pool.submit(run, ex, tests) if tests else None for ex, tests in units]
        check = dict(check_run.result()) if check_run is not None else {}
        check.update({t: known[t] for t in named if t in known})
        check = {t: check.get(t, "missing") for t in named}
        results: list[Result] = []
        no_tests: list[str] = []
        for (excluded, tests), unit_run in zip(units, unit_runs):
            outcomes = unit_run.result() if unit_run is not None else {}
            # skipped on this torch/mode: neither required to fail nor counted
            kept = tuple(t for t in tests if check[t] != "skipped")
            if kept:
                results.append(Result(excluded, kept, outcomes))
            else:
                no_tests.extend(excluded)
    return Report(check, results, no_tests)


# --------------------------------------------------------------------------
# running pytest


def _node_id(case: ET.Element) -> str:
    """pytest node id of a junit (xunit1) testcase element."""
    path = case.get("file", "")
    module = path[: -len(".py")].replace("/", ".") if path.endswith(".py") else ""
    classname = case.get("classname", "")
    parts = [path]
    if module and classname.startswith(module + "."):
        parts.append(classname[len(module) + 1 :])
    parts.append(case.get("name", ""))
    return "::".join(parts)


def parse_junit(xml_text: str) -> Outcomes:
    outcomes: Outcomes = {}
    for case in ET.fromstring(xml_text).iter("testcase"):
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            outcome = "failed"
        elif "skipped" in tags:
            outcome = "skipped"
        else:
            outcome = "passed"
        node = _node_id(case)
        # a test that passed its call but errored in teardown appears twice
        if outcomes.get(node) != "failed":
            outcomes[node] = outcome
    return outcomes


def pytest_runner(mode: str, python: str = sys.executable, log_dir: Path | None = None) -> Runner:
    """A Runner: pytest in a fresh process, a fresh Inductor cache per run."""

    def run(excluded: Sequence[str], tests: Sequence[str]) -> Outcomes:
        work = Path(tempfile.mkdtemp(prefix="tsrt-ablate-"))
        try:
            junit = work / "junit.xml"
            env = {
                **os.environ,
                "TSRT_MODE": mode,
                "TSRT_EXCLUDE_POINTS": ",".join(excluded),
                "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor-cache"),
                "PYTHONPATH": os.pathsep.join(
                    [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
                ),
            }
            env.pop("TSRT_DUMP_DIR", None)
            env.pop("EXPECTTEST_ACCEPT", None)
            proc = subprocess.run(
                [python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 "-o", "junit_family=xunit1", f"--junitxml={junit}", *tests],
                cwd=REPO, env=env, capture_output=True, text=True,
            )
            if log_dir is not None:
                name = "+".join(excluded) or "all-points"
                (log_dir / f"{name}.log").write_text(proc.stdout + proc.stderr)
            outcomes = parse_junit(junit.read_text()) if junit.exists() else {}
            # A named test with no result of its own: if pytest failed (a
            # collection error, e.g. install() refused at import), it failed
            # with the rest; otherwise it does not exist.
            absent = "failed" if proc.returncode not in (0, 5) else "missing"
            for t in tests:
                if "::" in t:
                    outcomes.setdefault(t, absent)
            return outcomes
        finally:
            shutil.rmtree(work, ignore_errors=True)

    return run


# --------------------------------------------------------------------------
# reporting


def format_report(report: Report, points: Sequence) -> str:
    by_name = {p.name: p for p in points}
    lines = []
    if report.broken_tests:
        lines.append("guarded_by tests that fail or do not exist with every point installed:")
        lines += [f"  {t}: {report.check[t]}" for t in report.broken_tests]
    for r in report.results:
        label = "+".join(r.excluded)
        speed = " ".join(
            f"[speed-only: {by_name[n].speed_only}]"
            for n in r.excluded if n in by_name and by_name[n].speed_only
        )
        if r.guarded:
            lines.append(f"guarded    {label} {speed}".rstrip())
            lines += [f"    fails: {t}" for t in r.failing]
            lines += [f"    (passes here: {t})" for t in r.still_passing]
        else:
            lines.append(f"UNGUARDED  {label}: still passing without it:")
            lines += [f"    {t}: {r.outcomes.get(t, 'missing')}" for t in r.still_passing]
    if report.no_tests:
        lines.append("points whose guarded_by names no test that runs on this torch/mode:")
        lines += [f"  {n}" for n in report.no_tests]
    n_ok = sum(r.guarded for r in report.results)
    lines.append(
        f"{n_ok} guarded, {len(report.unguarded)} unguarded, "
        f"{len(report.no_tests)} without tests, {len(report.broken_tests)} broken tests"
    )
    return "\n".join(lines)


def discover(points: Sequence, run: Runner, targets: Sequence[str],
             names: Iterable[str], groups: Iterable[str], jobs: int) -> str:
    baseline = run((), targets)
    units = select_units(points, names, groups)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        outs = list(pool.map(lambda u: run(u[0], targets), units))
    lines = []
    for (excluded, _), out in zip(units, outs):
        newly = sorted(t for t, o in out.items() if o == "failed" and baseline.get(t) == "passed")
        lines.append(f"{'+'.join(excluded)}: {len(newly)} failing")
        lines += [f"    {t}" for t in newly]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", help="backport, forced or native+fixes (default: TSRT_MODE, else by torch version)")
    ap.add_argument("--point", action="append", default=[], help="ablate only this point (repeatable)")
    ap.add_argument("--group", action="append", default=[],
                    help="leave out together every point whose name starts with GROUP. "
                         "or whose opt-in group is GROUP (e.g. dtensor)")
    ap.add_argument("--exclusive", action="store_true",
                    help="ablate only the points that apply to this torch release alone "
                         "(the ones it shares are ablated on the other release)")
    ap.add_argument("-j", "--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="pytest processes at a time")
    ap.add_argument("--log-dir", type=Path, help="keep each run's pytest output here")
    ap.add_argument("--check-junit", type=Path,
                    help="the JUnit XML of a run of the suite with every point installed, in "
                         "this mode: the check runs only the named tests it does not hold")
    ap.add_argument("--discover", nargs="+", metavar="TEST",
                    help="run these tests (files or node ids) per dropped point; print the failures")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(REPO))
    from torch_subclass_rt._modes import Mode
    from torch_subclass_rt._torch_compat import torch_version

    version = torch_version()
    mode = args.mode or default_mode(version)
    if mode not in (Mode.BACKPORT, Mode.FORCED, Mode.NATIVE_FIXES):
        ap.error(
            f"mode {mode!r}: points are installed in 'backport', 'forced' or "
            "'native+fixes' mode only"
        )
    points = points_for(version, mode)
    if not points:
        ap.error(f"no patch points for torch {version} in mode {mode}")
    if args.exclusive:
        args.point += [p.name for p in points if p.versions == {version}]
        if not args.point:
            ap.error(f"--exclusive: no point applies to torch {version} alone")
    if args.log_dir:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    run = pytest_runner(mode, log_dir=args.log_dir)
    print(f"torch {version}, mode {mode}: {len(points)} points", flush=True)
    if args.discover:
        print(discover(points, run, args.discover, args.point, args.group, args.jobs))
        return 0
    known = parse_junit(args.check_junit.read_text()) if args.check_junit else None
    report = ablate(points, run, args.point, args.group, args.jobs, known=known)
    print(format_report(report, points))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
