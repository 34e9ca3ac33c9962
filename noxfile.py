"""Test matrix: one nox session per torch configuration.

  nox -s "tests(torch='2.10.0')"   torch 2.10.0 + install()            (backport), then
                                   the ablation of the points only 2.10 takes,
                                   the v2.10.0 patch series check and the
                                   instruction gate (benchmarks/instructions.py)
  nox -s "tests(torch='2.11.0')"   torch 2.11.0 + install()            (backport), then
                                   tools/ablate_points.py, the patch series check
                                   and the instruction gate
  nox -s "tests(torch='2.12.1')"   torch 2.12.1 + install() (native+fixes: the later
                                   upstream fixes 2.12.1 lacks), then the fix tests
                                   alone in plain native (each must show its bug)
  nox -s "tests(torch='2.13.0')"   torch 2.13.0 native, then install(force=True),
                                   then a byte-for-byte diff of the two runs' graph
                                   dumps, then the fix and install tests in native+fixes,
                                   then the instruction gate in native
  nox -s "tests(torch='2.14.1')"   torch 2.14.1 + install() (native+fixes), with the
                                   renamed opaque API (CustomClassBase,
                                   register_custom_class) behind tsrt.OpaqueBase /
                                   tsrt.register_opaque, and 2.14's graph printing
                                   (test/expected/v2.14/); then the fix tests in native,
                                   and the upstream series (patches/upstream/) check
  nox -s "tests(torch='2.12.0')"   a first release whose patch release has the session
  nox -s "tests(torch='2.14.0')"   above: only what can differ per wheel (FIRST_RELEASES)

The fix tests (FIX_TESTS below) fail as xfail in plain native on
a release that has the bug and must pass with install(); the whole suite runs
once per torch in the mode that carries the fixes, so the matrix stays short.

Each torch version gets its own virtualenv under .nox/ (reused with -r).
"""

from __future__ import annotations

import os
import shutil
import time

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

PYTEST = ["python", "-m", "pytest", "test", "-q", "-p", "no:cacheprovider", "-rfEs"]


#: the tests of the upstream fixes whose bug shows in plain native (one module
#: per fix, points/<module>.py)
FIX_TESTS = [
    "test/points/test_value_opaque_outputs.py",
    "test/points/test_callable_value_opaque.py",
    "test/points/test_export_opaque_constants.py",
]
#: also upstream_bug tests (PR 193452), in a file of their own
LAZY_TESTS = "test/points/test_lazy_members.py"
#: spawns two gloo ranks per case (about a minute each with inductor): run
#: where the feature's two implementations are, the backport (2.11) and
#: native torch (2.13), not again in the modes that share one of them
#: (forced reuses 2.13's distributed code, native+fixes adds no distributed
#: point). Locally: TSRT_MODE=<mode> python -m pytest test/distributed/test_distributed_opaque_ranks.py
RANKS_TESTS = "test/distributed/test_distributed_opaque_ranks.py"

#: DTensor's compile scenarios over two gloo ranks, one spawn (2.5-4 minutes
#: at load 14): where DTensor's fake mesh differs, the backport (2.10 with
#: plain install(), 2.11 with install(dtensor=True)) and native 2.13; not in
#: forced mode nor native+fixes, which add no distributed point
DTENSOR_SCENARIOS = "test/distributed/test_dtensor_scenarios.py"

#: PhysicsNeMo's ShardTensor adopting the mesh as an inner attr: a real
#: third-party subclass over two gloo ranks, one spawn for both backends
#: (2.5 minutes on 2.10 and 2.11, 1.5 on 2.13, with a cold Inductor cache
#: on 2 cores at load 14). Installed, pinned and without physicsnemo's
#: own dependencies, where the feature's implementations are: the backport
#: on 2.10 and 2.11 (their fakes of a DeviceMesh differ) and native 2.13;
#: not in forced mode (2.13's distributed code, as RANKS_TESTS). Elsewhere
#: the test skips for want of physicsnemo.
PHYSICSNEMO_TESTS = "test/distributed/test_physicsnemo_shard_tensor.py"
PHYSICSNEMO_REQUIREMENTS = "test/requirements-physicsnemo.txt"
PHYSICSNEMO_TORCHES = ("2.10.0", "2.11.0", "2.13.0")
#: its warm second launch over the first one's cache (about 15 s on 2.13):
#: wrong grads on native 2.13 (xfail in the native suite), right with
#: install() (2.13's native+fixes run)
PHYSICSNEMO_WARM = f"{PHYSICSNEMO_TESTS}::TestShardTensorWarmLaunch"

#: tests of ``python -m torch_subclass_rt compare``, which sets up its own
#: stock and installed pytest runs (about a minute). What they check is the
#: tool's (differences reported test by test, exit codes) and holds on any
#: torch where install() changes ``status().mode``: they run once on a
#: backport torch (2.11) and once on a native one (2.13), not in every
#: session nor in every mode
COMPARE_TESTS = "test/tools/test_compare.py"

#: releases install() carries fixes on whose patch release (2.12.1, 2.14.1)
#: has a session running the whole suite. The .0 wheel ships the same
#: feature code; what can differ per wheel is which upstream bugs it has
#: (the fix tests in plain native: each must show its bug), that install()
#: carries their fixes, and the graphs it prints (the graph-dump suites,
#: against the same test/expected/v2.xx files). That check, not the whole
#: suite again, keeps the matrix within its time.
FIRST_RELEASES = ("2.12.0", "2.14.0")
#: a graph whose tracing read an opaque's members reused where the reads
#: differ (Note [Opaque reads in the AOTAutograd cache]): in one process and
#: across processes (about 25-60 s), and across two ranks sharing a cache
#: (one class of the DTensor scenarios file, about 15 s, where the suite
#: leaves that file out). Native torch 2.12-2.14 has the bug (xfail) and
#: native+fixes fixes it: both modes run them on each of those releases
CACHE_READS_TESTS = "test/points/test_opaque_reads.py"
CACHE_READS_RANKS = "test/distributed/test_dtensor_scenarios.py::TestOpaqueReadsRanks"
#: issue 152183 under the structured trace (a few seconds): every release
#: has it (xfail in plain native), install() fixes it
NO_REPR_TRACED_TESTS = "test/points/test_no_subclass_data_repr.py"
#: torch 2.14's partitioner logs a deprecation (about 10 s): xfail in plain
#: native on 2.14.x, passes elsewhere and with install()
DEPRECATED_NAME_TESTS = "test/points/test_partitioner_deprecated_name.py"
#: Inductor's backward overwrote the output and grad_output of a graph
#: with a mutated subclass input, also from a cache stock torch warmed
#: (about 30 s, two Inductor compiles): every release has it (xfail in
#: plain native), install() fixes it
DONATED_TESTS = "test/points/test_donated_buffers_split.py"
#: the same mutated input with a transposed output: Inductor's backward
#: failed its stride check (about 20 s, two Inductor compiles): every
#: release has it (xfail in plain native), install() fixes it
SAVED_STRIDES_TESTS = "test/points/test_saved_activation_strides.py"
#: PR 180530: isinstance(pg, OpaqueBase) asks the registry (2.12 has the
#: bug; the 2.12.1 and 2.14.1 plain-native lists run it too: a few seconds)
INSTANCECHECK_TESTS = "test/points/test_registered_opaque_instancecheck.py"
FIRST_RELEASE_NATIVE = [
    *FIX_TESTS,
    CACHE_READS_TESTS,
    CACHE_READS_RANKS,
    NO_REPR_TRACED_TESTS,
    DEPRECATED_NAME_TESTS,
    DONATED_TESTS,
    SAVED_STRIDES_TESTS,
    # PR 193452 (open upstream): registered members read eagerly
    LAZY_TESTS,
    # PR 180530: torch 2.12 refuses a ProcessGroup among inner attrs
    INSTANCECHECK_TESTS,
]
FIRST_RELEASE_FIXES = [
    *FIRST_RELEASE_NATIVE,
    "test/patching/test_install.py",
    "test/patching/test_no_deprecation.py",
    "test/runtime/test_opaque_attr_tracing.py",
    "test/runtime/test_opaque_subclass_attrs.py",
    "test/points/test_point_guards.py",
]


def _step(session: nox.Session, *args: str, **kwargs) -> None:
    """session.run, then how long it took: the matrix has a 45-minute
    target, and nox itself times only whole sessions."""
    start = time.monotonic()
    if session.run(*args, **kwargs) is None:
        return  # not run: --install-only
    session.log(f"step took {(time.monotonic() - start) / 60:.1f} min: {' '.join(args[:6])}")


def _run_suite(
    session: nox.Session, mode: str, dump_dir: str, env: dict[str, str], ignore: tuple[str, ...] = (),
    junit: str | None = None,
) -> None:
    """The whole suite in ``mode``; ``junit``: where to write its outcomes
    (the ablation's check reads them instead of running the tests again)."""
    shutil.rmtree(dump_dir, ignore_errors=True)
    session.log(f"suite in mode {mode}" + (f", without {', '.join(ignore)}" if ignore else ""))
    _step(session, *PYTEST, *(f"--ignore={f}" for f in ignore),
          # xunit1: the test file in each case (tools/ablate_points.py's node ids)
          *(("-o", "junit_family=xunit1", f"--junitxml={junit}") if junit else ()),
          env={**env, "TSRT_MODE": mode, "TSRT_DUMP_DIR": dump_dir})


def _tool(name: str):
    """tools/<name>.py as a module, for the constants the sessions share
    with it (neither module imports torch at module level)."""
    import importlib
    import sys

    root = os.path.dirname(os.path.abspath(__file__))
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(f"tools.{name}")


def _series_suites() -> tuple[str, ...]:
    """The test files tools/verify_patches.py runs in backport mode itself."""
    verify_patches = _tool("verify_patches")
    return tuple(str(p.relative_to(verify_patches.REPO_ROOT)) for p in verify_patches.SUITES)


def _run_files(session: nox.Session, mode: str, files: list[str], env: dict[str, str]) -> None:
    session.log(f"{' '.join(files)} in mode {mode}")
    # -rx: list each xfail (a bug shown in plain native) with its reason
    _step(session, *PYTEST[:3], *files, "-q", "-p", "no:cacheprovider", "-rfExs",
                env={**env, "TSRT_MODE": mode})


def _fresh_inductor_cache(session: nox.Session) -> dict[str, str]:
    """An empty Inductor/AOTAutograd cache directory for this run: results
    must not depend on entries an earlier run (of older code) left in the
    machine-wide default. Both modes of one torch share it, as they would on
    a user's machine (test/points/test_cache_across_modes.py)."""
    # absolute: Inductor runs the C++ compiler from another working directory
    cache = os.path.abspath(os.path.join(session.create_tmp(), "inductor-cache"))
    shutil.rmtree(cache, ignore_errors=True)
    return {"TORCHINDUCTOR_CACHE_DIR": cache}


#: differential examples per property per session (test/differential/)
FUZZ_EXAMPLES = "60"


def _fuzz_settings(torch: str) -> dict[str, str]:
    """Fewer examples per session than a run of the file alone (200), each
    torch with its own seed: the matrix checks five different sets of 60
    programs (300 in all) in under a third of the time of the same 200 five
    times (2.13's native and forced runs share one set, so their results
    compare). 100 a session cost about 6 lane-minutes more than 60, which
    put the matrix over its 45 minutes.
    A failure prints the seed to replay it. The environment wins."""
    seed = str(int("".join(torch.split("."))))  # 2.11.0 -> 2110
    return {
        "TSRT_FUZZ_EXAMPLES": os.environ.get("TSRT_FUZZ_EXAMPLES", FUZZ_EXAMPLES),
        "TSRT_FUZZ_SEED": os.environ.get("TSRT_FUZZ_SEED", seed),
    }


def _inductor_isa_env(session: nox.Session) -> dict[str, str]:
    """TORCHINDUCTOR_VEC_ISA_OK=1 where it changes nothing but time.

    Every process that compiles with Inductor builds and loads test
    libraries to learn which vector ISAs it may use (about 10 s each here);
    the matrix starts dozens of them. tools/vec_isa_probe.py runs that check
    once and prints the setting only if trusting the CPU flags gives the same
    ISAs. The environment wins."""
    setting = _tool("vec_isa_probe").SETTING
    key, _, value = setting.partition("=")
    if key in os.environ:
        return {}
    out = session.run("python", "tools/vec_isa_probe.py", silent=True)
    if out is None:  # not run (--install-only): nothing runs to use it either
        return {}
    # the output holds torch's warnings too
    if setting not in (line.strip() for line in out.splitlines()):
        session.log("Inductor checks the vector ISAs in every process")
        return {}
    session.log(f"Inductor's vector-ISA check agrees with the CPU flags: {setting}")
    return {key: value}


def _instruction_gate(session: nox.Session, mode: str, env: dict[str, str]) -> None:
    """benchmarks/instructions.py --gate: the per-call instructions of the
    subclass workload (callgrind, about a minute) against the baseline
    committed for this torch and mode, and in backport mode against native
    2.13's. Wall clock on a shared machine cannot see a 3 % regression;
    instruction counts can. Needs valgrind: without it the step fails
    (saying so) rather than skip the gate."""
    _step(session, "python", "benchmarks/instructions.py", "--gate", "--mode", mode, env=env)


_CHECK_TORCH = (
    "import sys, torch; v = torch.__version__.split('+')[0]; "
    "sys.exit(None if v == sys.argv[1] else f'session for torch {sys.argv[1]} has torch {v}')"
)


@nox.session
@nox.parametrize("torch", ["2.10.0", "2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.12.0", "2.14.0"])
def tests(session: nox.Session, torch: str) -> None:
    session.install(f"torch=={torch}")
    session.install("-e", ".[test]")
    if torch in PHYSICSNEMO_TORCHES:
        # --no-deps: physicsnemo's requirements would replace torch
        session.install("--no-deps", "-r", PHYSICSNEMO_REQUIREMENTS)
    # pip replaces the torch installed above if this package's requirement
    # excludes it; the session must test the release it is named for
    session.run("python", "-c", _CHECK_TORCH, torch)
    session.run("python", "-m", "torch_subclass_rt", "status", "--install")
    dumps = os.path.join(session.create_tmp(), "dumps")
    env = {**_fresh_inductor_cache(session), **_fuzz_settings(torch), **_inductor_isa_env(session)}
    if torch in PHYSICSNEMO_TORCHES:
        env["TSRT_REQUIRE_PHYSICSNEMO"] = "1"  # installed above: a skip would hide a failure
    if torch == "2.10.0":
        # the backport shares every point but a few with 2.11, whose session
        # ablates them; the 2-rank suite runs there too (same distributed
        # code); verify_patches runs the series' suites in backport mode
        junit = os.path.abspath(os.path.join(session.create_tmp(), "suite.xml"))
        _run_suite(session, "backport", os.path.join(dumps, "backport"), env,
                   ignore=(RANKS_TESTS, COMPARE_TESTS, *_series_suites()), junit=junit)
        # each point only 2.10 takes, left out alone, fails its guarded_by
        # (the shared points are ablated in the 2.11 session); the suite's
        # outcomes stand for its check run
        _step(session, "python", "tools/ablate_points.py", "--mode", "backport", "--exclusive",
              "-j", "2", "--check-junit", junit, env=env)
        # the v2.10.0 series: applies, passes in-tree, dumps equal the backport's
        _step(session, "python", "tools/verify_patches.py", "--base", "v2.10.0", env=env)
        _instruction_gate(session, "backport", env)
    elif torch == "2.11.0":
        # verify_patches runs the series' suites in backport mode (and
        # patched, comparing dumps): not run twice here
        junit = os.path.abspath(os.path.join(session.create_tmp(), "suite.xml"))
        _run_suite(session, "backport", os.path.join(dumps, "backport"), env,
                   ignore=_series_suites(), junit=junit)
        # each patch point, left out alone, fails the tests in its guarded_by
        # (the suite's outcomes stand for the check run of those it ran)
        _step(session, "python", "tools/ablate_points.py", "--mode", "backport", "-j", "2",
              "--check-junit", junit, env=env)
        # the same change as a git-am series: applies to v2.11.0, the suite
        # passes on the patched torch without this package, dumps identical
        _step(session, "python", "tools/verify_patches.py", "--base", "v2.11.0", env=env)
        _instruction_gate(session, "backport", env)
    elif torch in FIRST_RELEASES:
        _run_files(session, "native", FIRST_RELEASE_NATIVE, env)
        _run_files(session, "native+fixes", FIRST_RELEASE_FIXES, env)
    elif torch in ("2.12.1", "2.14.1"):
        _run_suite(session, "native+fixes", os.path.join(dumps, "native+fixes"), env,
                   ignore=(RANKS_TESTS, COMPARE_TESTS, DTENSOR_SCENARIOS))
        _run_files(session, "native+fixes", [CACHE_READS_RANKS], env)
        _run_files(session, "native", [*FIX_TESTS, LAZY_TESTS, CACHE_READS_TESTS, CACHE_READS_RANKS,
                                       NO_REPR_TRACED_TESTS, DEPRECATED_NAME_TESTS, DONATED_TESTS,
                                       SAVED_STRIDES_TESTS, INSTANCECHECK_TESTS],
                   env)
        if torch == "2.14.1":
            # the fixes upstream main lacks, as a ghstack-ready git-am series
            # (patches/upstream/): applies to v2.14.1, its in-tree tests pass
            _step(session, "python", "tools/verify_patches.py", "--base", "v2.14.1",
                  "--series", "upstream", env=env)
    else:
        _run_suite(session, "native", os.path.join(dumps, "native"), env)
        # compare's tests ran in the native run above (COMPARE_TESTS)
        _run_suite(session, "forced", os.path.join(dumps, "forced"), env,
                   ignore=(RANKS_TESTS, COMPARE_TESTS, PHYSICSNEMO_TESTS, DTENSOR_SCENARIOS))
        # Both runs already matched the same expected files; this also
        # catches a dump that one mode produced and the other did not.
        _step(
            session, "diff", "-r", os.path.join(dumps, "native"), os.path.join(dumps, "forced"),
            external=True,
        )
        _run_files(session, "native+fixes", [*FIX_TESTS, LAZY_TESTS, "test/patching/test_install.py",
                                             CACHE_READS_TESTS, CACHE_READS_RANKS,
                                             NO_REPR_TRACED_TESTS, PHYSICSNEMO_WARM, DONATED_TESTS,
                                             SAVED_STRIDES_TESTS],
                   env)
        _instruction_gate(session, "native", env)


#: (label, tests session whose virtualenv runs it, extra environment)
BENCH_CONFIGS = [
    ("2.11 backport", "tests-torch-2-11-0", {"TSRT_MODE": "backport"}),
    ("2.13 native", "tests-torch-2-13-0", {}),
]


@nox.session
def bench(session: nox.Session) -> None:
    """Scaling benchmark (not a default session; timings are not tests).

    Runs benchmarks/scaling.py on torch 2.11 + install() and native 2.13 in
    the tests sessions' virtualenvs (create them first with
    ``nox -s tests --install-only``), alternating, three runs each, then one
    table with both and their ratios, and benchmarks/scaling.png.
    ``nox -s bench -- --n 1,10,100 --calls 200`` passes arguments to each run.
    """
    session.install("matplotlib")  # only for the plot; the runs use the tests' venvs
    pythons = []
    for label, venv, env in BENCH_CONFIGS:
        python = os.path.join(os.path.dirname(session.virtualenv.location), venv, "bin", "python")
        if not os.path.exists(python):
            session.error(f"no virtualenv for {label} at {python}: run nox -s tests --install-only")
        pythons.append((label, python, env))
    out = session.create_tmp()
    env = {**_fresh_inductor_cache(session), "PYTHONPATH": os.getcwd()}
    runs = []
    for r in range(3):
        for label, python, extra in pythons:
            path = os.path.join(out, f"scaling-{label.replace(' ', '-')}-{r}.json")
            session.log(f"run {r + 1}/3: {label}")
            session.run(python, "benchmarks/scaling.py", "--json", path, *session.posargs,
                        env={**env, **extra}, external=True)
            runs.append(path)
    session.run("python", "benchmarks/scaling.py", "--combine", *runs,
                "--plot", "benchmarks/scaling.png")
