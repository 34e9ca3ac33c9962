#!/usr/bin/env python3
"""End-to-end parity check: the in-tree patch series vs. the backport.

    .nox/tests-torch-2-11-0/bin/python tools/verify_patches.py --base v2.11.0 \\
        [--patches-dir DIR] [--keep DIR] [--skip-backport-run] [--fail-fast]

Run it with the Python of an environment holding the torch the series is
for (torch 2.11.0 for ``--base v2.11.0``). Steps, each stopping with a clear
message on failure:

1. checkout: tools/make_checkout.py from the installed wheel (tag v2.11.0);
2. apply: tools/apply_patches.py (``git am -3``) with the series;
3. materialize: a temp dir holding a ``torch`` package made of hard links to
   the installed files, except the files the series changed, which are real
   copies of the patched sources (the installed torch is never modified);
4. run the graph-dump suite (test/) with that dir first on PYTHONPATH and
   ``TSRT_MODE=patched``: nothing is installed, torch's own patched code
   does the work; then the series' own in-tree test file, with
   torch_subclass_rt made unimportable;
5. run the suite in ``backport`` mode (stock torch + torch_subclass_rt.install());
6. compare every graph dump of 4 with 5: same names, same bytes.

Exit status 0 only if the series applies, both suite runs and the in-tree
test pass, and the dumps are identical.

``--series upstream`` (with ``--base v2.14.1``, :data:`UPSTREAM_BASE`)
verifies ``patches/upstream/`` instead: the fixes upstream main still lacks,
one commit each, for submission with ghstack (CONTRIBUTING.md, "The upstream
series"). Steps 1-3 as above, then only the series' in-tree tests (each
``test/*.py`` a commit adds, run with torch_subclass_rt unimportable), each
twice: it must pass on the patched torch and fail on the stock one (a test
that passes without its commit shows no bug). The
series changes what native torch does, so there is no backport to compare
its graphs with. ``--fail-fast`` stops the suite at
its first failing test and the check at its first failing step (a series
known to be broken, as in tools' own tests, fails in seconds, not minutes).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools._common import (  # noqa: E402
    PATCHES_ROOT,
    REPO_ROOT,
    ToolError,
    git,
    main_wrapper,
    normalize_version,
    patched_files,
    series,
    series_dir,
)
from tools import apply_patches, make_checkout, series_map, upstream  # noqa: E402

# the graph-dump suites compared between the patched torch and the backport
SUITES = (
    REPO_ROOT / "test" / "runtime" / "test_opaque_subclass_attrs.py",
    REPO_ROOT / "test" / "runtime" / "test_opaque_attr_tracing.py",
    REPO_ROOT / "test" / "points" / "test_point_guards.py",
    # no dumps; run against the patched torch for the series' behaviour
    REPO_ROOT / "test" / "runtime" / "test_opaque_subclass_parity.py",
    # no graph dumps: run in both modes for its assertions (DeviceMesh /
    # ProcessGroup registration and errors must agree)
    REPO_ROOT / "test" / "distributed" / "test_device_mesh_opaque.py",
    # no graph dumps: DTensor's mesh as an inner attr, unconditional in the
    # series (0014), install(dtensor=True) in backport mode
    REPO_ROOT / "test" / "distributed" / "test_dtensor_opaque_mesh.py",
    # no graph dumps: subclasses without __repr__ and the donated-buffer
    # case (0018); the patched torch must pass them as install() does
    REPO_ROOT / "test" / "points" / "test_lazy_log_and_donated_buffers.py",
    # no graph dumps: registered members resolved when read (0020)
    REPO_ROOT / "test" / "points" / "test_lazy_members.py",
    # no graph dumps: a subclass without __repr__ under the structured
    # trace (0021)
    REPO_ROOT / "test" / "points" / "test_no_subclass_data_repr.py",
    # no graph dumps: a value opaque's attributes in compiled code (v2.11.0
    # 0026) and a value type with __fx_repr__ only (v2.10.0 0000)
    REPO_ROOT / "test" / "points" / "test_value_opaque_attrs.py",
)

#: the release the upstream series (patches/upstream/) is written against:
#: the newest release the project tests (its commits rebase onto main)
UPSTREAM_BASE = "2.14.1"
UPSTREAM_SERIES = PATCHES_ROOT / "upstream"
UPSTREAM_BRANCH = f"opaque-fixes-upstream-v{UPSTREAM_BASE}"

#: the suites that test one patch of the series: a series that leaves that
#: patch out (series_map.LEFT_OUT_OF_SERIES) has nothing for them to test
SUITE_NEEDS_PATCH = {
    REPO_ROOT / "test" / "distributed" / "test_dtensor_opaque_mesh.py": "0014",
}


def suites_for(version: str) -> tuple[Path, ...]:
    """The SUITES the series for ``version`` is verified with."""
    left_out = series_map.LEFT_OUT_OF_SERIES.get(version, {})
    return tuple(s for s in SUITES if SUITE_NEEDS_PATCH.get(s) not in left_out)


def in_tree_tests(patches: list[Path]) -> list[str]:
    """The series' own test files, run in-tree: every ``test/*.py`` a patch
    of the series touches, in series order. Read from the series, so a
    series for another base (v2.10.0 leaves out DTensor's 0014/0015) runs
    exactly the tests it adds."""
    tests: list[str] = []
    for patch in patches:
        for path in patched_files(patch):
            if path.startswith("test/") and path.endswith(".py") and path not in tests:
                tests.append(path)
    return tests


# Runs the suite under pytest; the harness writes every graph dump it
# compares to $TSRT_DUMP_DIR (same file names as test/expected/).
_SUITE_RUNNER = r"""
import os, sys
from pathlib import Path
test_dir = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(test_dir))
import torch
want = os.environ.get("TSRT_EXPECT_TORCH_UNDER")
if want and not Path(torch.__file__).resolve().is_relative_to(Path(want).resolve()):
    sys.exit(f"verify_patches: imported torch from {torch.__file__}, expected under {want}")
print(f"verify_patches: torch {torch.__version__} from {Path(torch.__file__).parent}", flush=True)
import pytest
sys.exit(pytest.main(sys.argv[2:]))
"""

# Runs the in-tree test file with torch_subclass_rt unimportable: the
# series' test must be self-contained.
_IN_TREE_RUNNER = r"""
import os, runpy, sys
sys.modules["torch_subclass_rt"] = None  # any import of it fails
sys.argv = [sys.argv[1]] + sys.argv[2:]
# as `python test/x.py` would: the script's directory first, not the cwd
# (the checkout root holds an unbuilt torch/ source tree)
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def step(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def installed_torch() -> tuple[Path, str]:
    root = make_checkout.default_torch_root()
    proc = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise ToolError(f"cannot import torch with {sys.executable}:\n{proc.stderr}")
    return root, normalize_version(proc.stdout.strip())


def changed_files(checkout: Path, base: str) -> tuple[list[str], list[str]]:
    """(changed or added, deleted) paths under torch/, relative to torch/."""
    out = git(checkout, "diff", "--name-status", "--no-renames", f"{base}..HEAD", "--", "torch").stdout
    changed, deleted = [], []
    for line in out.splitlines():
        status, path = line.split("\t", 1)
        rel = path[len("torch/"):]
        (deleted if status.startswith("D") else changed).append(rel)
    return changed, deleted


def materialize(torch_root: Path, checkout: Path, base: str, dest: Path) -> list[str]:
    """dest/torch = hard links to torch_root + copies of the patched files."""
    changed, deleted = changed_files(checkout, base)
    skip = set(changed) | set(deleted)
    # stale bytecode of a patched module must not be linked in
    stale_pyc = {
        (str(Path(rel).parent / "__pycache__"), Path(rel).stem) for rel in skip if rel.endswith(".py")
    }
    target = dest / "torch"
    linked = 0
    for dirpath, dirnames, filenames in os.walk(torch_root):
        rel_dir = Path(dirpath).relative_to(torch_root)
        (target / rel_dir).mkdir(parents=True, exist_ok=True)
        for name in filenames:
            rel = str(rel_dir / name) if str(rel_dir) != "." else name
            if rel in skip:
                continue
            if rel_dir.name == "__pycache__" and (str(rel_dir), name.split(".", 1)[0]) in stale_pyc:
                continue
            src = Path(dirpath) / name
            dst = target / rel
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)  # another filesystem: copy instead
            linked += 1
    for rel in changed:
        dst = target / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.exists():
            dst.unlink()
        shutil.copyfile(checkout / "torch" / rel, dst)  # a new inode, never a link
    return changed


def run_suite(mode: str, dump_dir: Path, pythonpath: list[Path], expect_torch_under: Path | None,
              log: Path, fail_fast: bool = False, suites: tuple[Path, ...] = SUITES) -> int:
    env = dict(os.environ)
    env["TSRT_MODE"] = mode
    env["TSRT_DUMP_DIR"] = str(dump_dir)
    env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in pythonpath), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("EXPECTTEST_ACCEPT", None)  # compare, never record
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if expect_torch_under is not None:
        env["TSRT_EXPECT_TORCH_UNDER"] = str(expect_torch_under)
    cmd = [sys.executable, "-c", _SUITE_RUNNER, str(REPO_ROOT / "test"), *map(str, suites),
           "-q", "-p", "no:cacheprovider", "-rs", *(["-x"] if fail_fast else [])]
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
    return proc.returncode


def run_in_tree_test(checkout: Path, site: Path, log: Path, test: str) -> int:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(site)  # the patched torch; not this repository
    env.pop("TSRT_MODE", None)
    # The in-tree tests assert graphs with assertExpectedInline; accepting
    # would rewrite the checkout's copy and pass whatever the graphs are.
    env.pop("EXPECTTEST_ACCEPT", None)
    # With CI set, torch's run_tests() writes XML reports through xmlrunner
    # (PyTorch CI's reporting), which is not a dependency here.
    env.pop("CI", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    cmd = [sys.executable, "-c", _IN_TREE_RUNNER, test]
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=checkout, env=env, stdout=fh, stderr=subprocess.STDOUT)
    return proc.returncode


def compare_dumps(a: Path, b: Path) -> list[str]:
    names_a = {p.name for p in a.glob("*.txt")} if a.is_dir() else set()
    names_b = {p.name for p in b.glob("*.txt")} if b.is_dir() else set()
    problems = []
    for n in sorted(names_a - names_b):
        problems.append(f"only in patched run: {n}")
    for n in sorted(names_b - names_a):
        problems.append(f"only in backport run: {n}")
    for n in sorted(names_a & names_b):
        if not filecmp.cmp(a / n, b / n, shallow=False):
            problems.append(f"differs: {n}")
    if not names_a and not names_b:
        problems.append("no graph dumps were written by either run")
    return problems


def _tail(path: Path, n: int = 40) -> str:
    lines = path.read_text(errors="replace").splitlines()
    return "\n".join(lines[-n:])


def verify_upstream(base: str, patches_dir: Path | None, work: Path,
                    fail_fast: bool = False) -> list[str]:
    """Apply the upstream series to a checkout of the installed torch and
    run its in-tree tests against it (module docstring, ``--series upstream``)."""
    version = normalize_version(base.lstrip("v"))
    if version != UPSTREAM_BASE:
        raise ToolError(
            f"--series upstream is written against v{UPSTREAM_BASE}, not {base} "
            "(rebase it and change UPSTREAM_BASE to move it)"
        )
    torch_root, installed = installed_torch()
    if installed != version:
        raise ToolError(
            f"--series upstream needs torch {version}, but {sys.executable} has torch "
            f"{installed} (use .nox/tests-torch-2-14-1/bin/python)"
        )
    directory = Path(patches_dir) if patches_dir is not None else UPSTREAM_SERIES
    failures: list[str] = []
    step(f"checkout of the installed torch {installed} ({torch_root})")
    checkout = work / "checkout"
    make_checkout.make_checkout(torch_root, checkout)
    step(f"apply the upstream series ({directory}) as tools/upstream.py --dry-run does")
    # the same branch and commits tools/upstream.py makes before ghstack
    # submit, so this is its dry run on the real series too
    branch, tag, applied = upstream.prepare_branch(checkout, UPSTREAM_BRANCH, directory)
    for name in applied:
        print(f"    {name}")
    print(f"    branch {branch}; would run: {' '.join(upstream.ghstack_command(tag, 'main', []))}")
    for line in git(checkout, "log", "--format=%H", f"{tag}..HEAD").stdout.split():
        message = git(checkout, "log", "-1", "--format=%B", line).stdout
        subject = message.splitlines()[0]
        # what a PyTorch reviewer looks for: [area] title, the issue, a test plan
        if not re.match(r"^\[[\w.-]+\] ", subject):
            failures.append(f"commit {subject!r}: the subject has no [area] prefix")
        # an upstream issue, or, where none exists yet, the one written up
        # in patches/upstream/ISSUES.md for a maintainer to file
        if not re.search(r"(Fixes|Part of|Addresses) .*(#\d+|ISSUES\.md)", message):
            failures.append(
                f"commit {subject!r}: the message names no upstream issue (#NNNN) "
                "nor its write-up in patches/upstream/ISSUES.md"
            )
        if "Test Plan:" not in message:
            failures.append(f"commit {subject!r}: the message has no Test Plan")
    step("materialize the patched torch (hard links + patched copies)")
    site = work / "site"
    changed = materialize(torch_root, checkout, f"v{version}", site)
    print(f"    {site}/torch: {len(changed)} patched files")
    tests = in_tree_tests(series(directory))
    if not tests:
        failures.append(f"the upstream series ({directory}) adds no test file")
    # the stock torch: an empty directory first on PYTHONPATH
    stock = work / "stock-site"
    stock.mkdir(exist_ok=True)
    for test in tests:
        problems = check_both_ways(
            test, installed,
            patched=lambda log: run_in_tree_test(checkout, site, log, test),
            stock=lambda log: run_in_tree_test(checkout, stock, log, test),
            work=work,
        )
        failures += problems
        if problems and fail_fast:
            return failures
    return failures


def check_both_ways(test: str, version: str, patched, stock, work: Path) -> list[str]:
    """An upstream commit's in-tree test passes on the patched torch and
    fails on the stock one (``patched`` / ``stock``: run it, writing the
    given log, and return the exit status): a test that passes without its
    commit shows no bug."""
    step(f"in-tree test {test} of the upstream series")
    log = work / f"in-tree-{Path(test).stem}.log"
    rc = patched(log)
    if rc != 0:
        return [f"{test} failed (exit {rc}); log {log}:\n" + _tail(log)]
    print("    passed")
    step(f"the same test on stock torch {version}: it must fail")
    stock_log = work / f"stock-{Path(test).stem}.log"
    rc = stock(stock_log)
    if rc == 0:
        return [
            f"{test} passes on stock torch {version} too: it does not show the bug its "
            f"commit fixes; log {stock_log}"
        ]
    print(f"    failed, as it must (exit {rc})")
    return []


def verify(base: str, patches_dir: Path | None, work: Path, skip_backport: bool = False,
           fail_fast: bool = False) -> list[str]:
    version = normalize_version(base.lstrip("v"))
    torch_root, installed = installed_torch()
    if installed != version:
        raise ToolError(
            f"--base {base} needs torch {version}, but {sys.executable} has torch {installed} "
            f"(run with the Python of a torch {version} environment, e.g. .nox/tests-torch-2-11-0/bin/python after `python3 -m nox --install-only`)"
        )
    failures: list[str] = []

    step(f"checkout of the installed torch {installed} ({torch_root})")
    checkout = work / "checkout"
    make_checkout.make_checkout(torch_root, checkout)

    step("apply the series")
    applied = apply_patches.apply(checkout, patches_dir=patches_dir)
    for name in applied:
        print(f"    {name}")

    step("materialize the patched torch (hard links + patched copies)")
    site = work / "site"
    changed = materialize(torch_root, checkout, f"v{version}", site)
    print(f"    {site}/torch: {len(changed)} patched files")

    step("graph-dump suite against the patched torch (TSRT_MODE=patched)")
    patched_dumps = work / "dumps" / "patched"
    suites = suites_for(version)
    rc = run_suite("patched", patched_dumps, [site, REPO_ROOT], site, work / "suite-patched.log",
                   fail_fast, suites)
    if rc != 0:
        failures.append(f"suite in patched mode failed (exit {rc}); log {work / 'suite-patched.log'}:\n"
                        + _tail(work / "suite-patched.log"))
        if fail_fast:
            return failures
    else:
        print("    passed")

    tests = in_tree_tests(series(series_dir(version, patches_dir)))
    if not tests:
        failures.append(f"the v{version} series adds no test file")
    for test in tests:
        step(f"in-tree test {test} of the series")
        log = work / f"in-tree-{Path(test).stem}.log"
        if not (checkout / test).is_file():
            failures.append(f"the series adds no {test}")
            continue
        rc = run_in_tree_test(checkout, site, log, test)
        if rc != 0:
            failures.append(f"{test} failed (exit {rc}); log {log}:\n" + _tail(log))
            if fail_fast:
                return failures
        else:
            print("    passed")

    if skip_backport:
        return failures
    step("graph-dump suite in backport mode (stock torch + torch_subclass_rt.install())")
    backport_dumps = work / "dumps" / "backport"
    rc = run_suite("backport", backport_dumps, [REPO_ROOT], None, work / "suite-backport.log",
                   fail_fast, suites)
    if rc != 0:
        failures.append(f"suite in backport mode failed (exit {rc}); log {work / 'suite-backport.log'}:\n"
                        + _tail(work / "suite-backport.log"))
    else:
        print("    passed")

    step("compare graph dumps, patched vs backport")
    problems = compare_dumps(patched_dumps, backport_dumps)
    if problems:
        failures.append(
            "graph dumps differ between the series and the backport "
            f"({patched_dumps} vs {backport_dumps}):\n  " + "\n  ".join(problems)
        )
    else:
        print(f"    {len(list(patched_dumps.glob('*.txt')))} dumps identical")
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="base tag, e.g. v2.11.0")
    ap.add_argument("--patches-dir", type=Path, help="series to verify (default: patches/<base>/)")
    ap.add_argument("--keep", type=Path, help="work in this (new) directory and keep it")
    ap.add_argument("--skip-backport-run", action="store_true",
                    help="only apply + run the patched suite and in-tree test (no dump comparison)")
    ap.add_argument("--fail-fast", action="store_true",
                    help="stop at the first failing test and the first failing step")
    ap.add_argument("--series", choices=("backport", "upstream"), default="backport",
                    help="backport: patches/<base>/ (default); upstream: patches/upstream/, "
                    f"the fixes upstream lacks, against v{UPSTREAM_BASE} (in-tree tests only)")
    args = ap.parse_args(argv)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=False)
        work = args.keep.resolve()
    else:
        work = Path(tempfile.mkdtemp(prefix="tsrt-verify-"))
    try:
        if args.series == "upstream":
            failures = verify_upstream(args.base, args.patches_dir, work, args.fail_fast)
        else:
            failures = verify(args.base, args.patches_dir, work, args.skip_backport_run,
                              args.fail_fast)
    except ToolError as e:
        failures = [str(e)]
    if not failures and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print(f"\nFAILED: verify_patches --base {args.base} --series {args.series} "
              f"(work dir kept: {work})", file=sys.stderr)
        for f in failures:
            print(f"\n* {f}", file=sys.stderr)
        return 1
    if args.series == "upstream":
        print("\nOK: the upstream series applies and its in-tree tests pass")
        return 0
    print("\nOK: the series applies, the suites pass, and the graph dumps are identical")
    return 0


if __name__ == "__main__":
    main_wrapper(main)
