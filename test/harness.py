"""Shared test machinery: the mode under test and graph-dump expectations.

Mode under test (env var ``TSRT_MODE``):

``native``
    torch >= 2.12 as shipped; torch_subclass_rt.install() is never called.
    The reference behaviour.
``backport``
    torch 2.10 or 2.11 with ``torch_subclass_rt.install()``.
``forced``
    torch 2.13 with ``torch_subclass_rt.install(force=True)``: our runtime
    replaces the native one and must behave (and trace) identically.
``native+fixes``
    torch 2.12.x / 2.13.0 / 2.14.x with ``torch_subclass_rt.install()``: the
    native implementation plus the later upstream fixes the release lacks
    (Note [Upstream fixes] in ``points/__init__.py``; tests marked :func:`upstream_bug`).
``patched``
    torch 2.10 or 2.11 with its in-tree patch series (patches/v2.10.0,
    patches/v2.11.0) applied to its sources (tools/verify_patches.py puts such a torch first on PYTHONPATH);
    nothing is installed. Must trace the graphs the backport traces.

Default: ``backport`` on torch 2.10 and 2.11, ``native`` on torch >= 2.12.

Graph dumps (:func:`assertExpectedGraph`) live in
``test/expected/<TestClass>.<test>.<name>.txt`` and are shared by every torch
version and mode; ``test/expected/v<major>.<minor>/<same name>`` overrides the
shared file for one torch release when its graphs legitimately differ. Native
and forced runs of one torch read the very same files: forced mode is only
correct if it traces the graphs native torch traces. A device-instantiated
test's CUDA variant shares its CPU variant's files (Note [One expected dump
for CPU and CUDA]).

``EXPECTTEST_ACCEPT=1`` records dumps instead of failing: a dump equal to the
shared file passes untouched (and deletes the running torch's override, which
would then override nothing); a missing shared file is written; otherwise the
per-version override of the running torch is (re)written. Comparisons are
always exact; a mismatch shows the diff expected-first (expected lines ``-``,
actual ``+``), as expecttest does.

``test/test_expectations.py`` checks the directory itself: every file belongs
to a test method that exists, and every override has a shared counterpart
(or a recorded reason) and differs from it.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import torch
from torch._dynamo.testing import normalize_gm

from torch_subclass_rt import _torch_compat
from torch_subclass_rt._modes import TEST_MODES as MODES
from torch_subclass_rt._modes import Mode

EXPECTED_DIR = Path(__file__).resolve().parent / "expected"


def torch_major_minor() -> tuple[int, int]:
    major, minor = _torch_compat.version_tuple()[:2]
    return major, minor


def default_mode() -> Mode:
    return Mode.NATIVE if torch_major_minor() >= (2, 12) else Mode.BACKPORT


def current_mode() -> Mode:
    mode = os.environ.get("TSRT_MODE", "").strip() or default_mode()
    if mode not in MODES:
        raise RuntimeError(f"TSRT_MODE={mode!r}: expected one of {', '.join(MODES)}")
    return Mode(mode)


# --------------------------------------------------------------------------
# opaque members (torch >= 2.11)

#: torch 2.10's own opaque registration takes no ``guard_fn`` / ``members``;
#: ``install()`` gives it 2.11's (points/_opaque_members.py), so they exist
#: in the backport mode and with a patched torch, not in a stock 2.10
HAS_OPAQUE_MEMBERS = _torch_compat.has_opaque_members() or current_mode() == Mode.BACKPORT
needs_opaque_members = __import__("unittest").skipUnless(
    HAS_OPAQUE_MEMBERS,
    f"reads an opaque's members in compiled code or relies on its guard_fn: "
    f"torch {_torch_compat.torch_version()} has no opaque members without install() "
    "(torch >= 2.11 has them)",
)


#: a *value* opaque's members read in compiled code: torch 2.11 reworked
#: value opaques in Dynamo (a fake with members, built without a source from
#: the constructor's arguments, hoisting); install() gives torch 2.10 the
#: members of reference opaques only (points/_opaque_members.py), and 2.10's
#: Dynamo keeps reading any attribute of a value opaque, as stock 2.10 does
needs_value_opaque_members = __import__("unittest").skipUnless(
    torch_major_minor() >= (2, 11),
    f"reads a value opaque's members in compiled code: torch {_torch_compat.torch_version()} "
    "treats value opaques as plain constants (torch 2.11 added their members; install() "
    "on 2.10 gives members to reference opaques only)",
)


def member_kwargs(guard_fn=None, **members: str) -> dict:
    """``register_opaque`` keyword arguments for ``guard_fn`` and members
    (``start="USE_REAL"``), or none on a torch without opaque members: the
    type is registered plainly there, and the tests that read its members
    carry :data:`needs_opaque_members`."""
    if not HAS_OPAQUE_MEMBERS:
        return {}
    from torch._library.opaque_object import MemberType

    kwargs: dict = {}
    if guard_fn is not None:
        kwargs["guard_fn"] = guard_fn
    if members:
        kwargs["members"] = {name: getattr(MemberType, kind) for name, kind in members.items()}
    return kwargs


def setup_mode() -> Mode:
    """Put torch into the mode under test (test/conftest.py calls it
    before any test module is imported; see Note [The mode is set before a
    test module runs]).

    Idempotent (tests call it again to undo what another test did). Returns
    the mode.
    """
    mode = current_mode()
    # native: torch's own implementation end to end; patched: the feature
    # comes from torch's (patched) sources. Either way nothing may be
    # installed; torch_subclass_rt stays importable for its OpaqueBase /
    # register_opaque spelling, which patches nothing.
    if mode in (Mode.NATIVE, Mode.NATIVE_FIXES) and torch_major_minor() < (2, 12):
        raise RuntimeError(
            f"TSRT_MODE={mode} needs torch >= 2.12 (native opaque attrs); "
            f"this is torch {torch.__version__}"
        )
    if mode == Mode.PATCHED and _torch_compat.torch_version() not in _torch_compat.BACKPORT_VERSIONS:
        raise RuntimeError(
            f"TSRT_MODE=patched needs a backport release "
            f"({', '.join(_torch_compat.BACKPORT_VERSIONS)}) with its patch series "
            f"applied; this is torch {torch.__version__}"
        )
    if mode in (Mode.NATIVE, Mode.PATCHED):
        tsrt = sys.modules.get("torch_subclass_rt")
        if tsrt is not None:
            st = tsrt.status()
            assert st.mode == Mode.OFF and not st.points, (
                f"{mode} mode but torch_subclass_rt is installed: {st!r}"
            )
        return mode

    import torch_subclass_rt

    st = torch_subclass_rt.install(force=(mode == Mode.FORCED))
    assert st.mode == mode, f"TSRT_MODE={mode} but install() gave {st!r}"
    assert torch_subclass_rt.status().mode == mode
    return mode


def restore_mode() -> None:
    """Undo whatever a test did to the install state (test_install.py)."""
    import torch_subclass_rt

    mode = current_mode()
    if mode in (Mode.NATIVE, Mode.PATCHED):
        torch_subclass_rt.uninstall()
    else:
        st = torch_subclass_rt.status()
        if st.mode != mode:
            torch_subclass_rt.uninstall()
        setup_mode()


# --------------------------------------------------------------------------
# upstream bugs


def _expected_failure_wrapper(fn, raises, match: str, what: str, passed_msg: str):
    """``fn`` run where it is expected to fail with ``raises`` matching ``match``.

    Works under pytest and under ``run_tests()`` (unittest): the wrapper
    carries unittest's expected-failure flag, which both runners honour
    (pytest reports xfail), and re-raises only the expected error. Another
    error, or none, cannot be raised through that flag (unittest counts any
    error as the expected one), so the test returns normally instead: an
    *unexpected success*, a failure under both runners, with why on stderr.
    """
    import functools
    import sys
    import traceback

    pattern = re.compile(match, re.S)
    names = " or ".join(t.__name__ for t in raises)

    def messages(e: BaseException) -> str:
        # the error and those it was raised from or while handling (torch
        # often re-raises the telling one as a generic one)
        seen = []
        while e is not None and e not in seen:
            seen.append(e)
            e = e.__cause__ or e.__context__
        return "\n".join(f"{type(x).__name__}: {x}" for x in seen)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any other error is not the bug
            if isinstance(e, raises) and pattern.search(messages(e)):
                raise
            problem = (
                f"{what}: expected {names} matching {match!r}, got "
                f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            )
        else:
            problem = f"{what}: {passed_msg}"
        print(f"NOT THE EXPECTED FAILURE: {problem}", file=sys.stderr)

    wrapper.__unittest_expecting_failure__ = True
    return wrapper


def expected_failure(raises, match: str, reason: str, when: bool = True):
    """Mark a test method that fails, where ``when`` holds, with one of
    ``raises`` (an exception type or a tuple of them) whose message matches
    ``match`` (``re.search`` with ``re.S``, in ``ExcType: message`` lines
    of the error and those it was raised from): the bug it records. Where ``when`` is false
    it must pass. Any other outcome fails the test (see
    :func:`_expected_failure_wrapper`)."""
    raises = raises if isinstance(raises, tuple) else (raises,)

    def deco(fn):
        if not when:
            return fn
        return _expected_failure_wrapper(
            fn, raises, match, f"known failure ({reason})",
            "the test passed: the failure is gone; drop the marker",
        )

    return deco


def upstream_bug(fix: str, broken_on: tuple[str, ...], fails_with: tuple[type, ...],
                 match: str, carried: bool = True):
    """Mark a test that reproduces an upstream bug, fixed upstream by ``fix``.

    ``broken_on``: the torch releases that have the bug as shipped. On those,
    in a mode where nothing carries the fix (``native``; any mode when
    ``carried`` is False), the test must fail with one of ``fails_with``
    whose message matches ``match`` (``re.search``; the bug's own message),
    recorded as an expected failure (pytest: xfail); if it passes, or fails
    otherwise, it fails: the release does not have the bug and the version
    list is wrong, or something else broke. Everywhere else (another torch,
    or a mode that installs the fix: native+fixes, forced, backport, patched)
    it must pass.
    """
    def deco(fn):
        version = _torch_compat.torch_version()
        mode = current_mode()
        expect_bug = version in broken_on and (not carried or mode == Mode.NATIVE)
        wrapper = fn
        if expect_bug:
            wrapper = _expected_failure_wrapper(
                fn, tuple(fails_with), match,
                f"upstream bug [{fix}] on torch {version} in mode {mode}",
                "the test passed: this release does not have the bug; correct the versions",
            )
        wrapper.upstream_fix = fix
        wrapper.broken_on = broken_on
        return wrapper

    return deco


# --------------------------------------------------------------------------
# graph dumps


_opaque_name_fixes: dict[str, str] = {}


def register_type_name_normalization(cls: type) -> None:
    """Graphs name opaque types and subclasses after their defining module
    (``test_opaque_subclass_attrs_Counter``), which depends on how the test
    module was imported; dumps use the bare class name instead."""
    from torch._library.opaque_object import get_opaque_type_name
    from torch.fx.graph import _illegal_char_regex

    names = {f"{cls.__module__}.{cls.__qualname__}"}
    if _torch_compat.is_registered_opaque_type(cls):
        names.add(get_opaque_type_name(cls))
    for full in names:
        _opaque_name_fixes[_illegal_char_regex.sub("_", full)] = cls.__name__
        _opaque_name_fixes[full] = cls.__name__


def graph_text(gm: torch.fx.GraphModule) -> str:
    text = normalize_gm(gm.print_readable(print_output=False))
    # longest first so a name that prefixes another is not half-replaced
    for long, short in sorted(_opaque_name_fixes.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(long, short)
    # compiled autograd prefixes inlined AOT backward nodes with the process-
    # wide AOT graph id ("aot10_mul_1"), which depends on what ran before
    text = re.sub(r"\baot\d+_", "aotN_", text)
    return text.rstrip("\n") + "\n"


def _accepting() -> bool:
    return os.environ.get("EXPECTTEST_ACCEPT", "").lower() in ("1", "true", "yes", "on")


def expected_first_diff(path: Path, expected: str, actual: str) -> str:
    """Unified diff from the expected file to what the test produced, as
    expecttest shows it: expected lines ``-``, actual lines ``+``."""
    import difflib

    try:
        shown = path.relative_to(EXPECTED_DIR.parent)
    except ValueError:
        shown = path
    return "".join(
        difflib.unified_diff(
            expected.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            fromfile=f"{shown} (expected)",
            tofile="actual",
        )
    )


def _device_neutral(test) -> tuple[str, str]:
    """(class, method) under which a test's dumps are stored: a CUDA
    variant of a device-instantiated test (``TestXCUDA.test_y_cuda``) shares
    the CPU variant's files (``TestXCPU.test_y_cpu``); see
    :func:`_cpu_spelling`."""
    cls, method = type(test).__name__, test._testMethodName
    if cls.endswith("CUDA") and method.endswith("_cuda"):
        return cls[: -len("CUDA")] + "CPU", method[: -len("_cuda")] + "_cpu"
    return cls, method


#: a CUDA device as graph dumps spell it, and the CPU spelling it is
#: compared as (the tests run one device: cuda:0)
_CUDA_SPELLINGS = (
    ("device(type='cuda', index=0)", "device(type='cpu')"),
    ("device='cuda:0'", "device='cpu'"),
    ("'cuda:0'", "'cpu'"),
)


def _cpu_spelling(test, text: str) -> str:
    """Note [One expected dump for CPU and CUDA]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    The graphs these tests dump are what Dynamo and AOTAutograd make of opaque attrs, which does not
    depend on the device; so a CUDA variant checks (and records) the CPU
    variant's file, its device written as the CPU one. A graph that does
    differ by device fails on the GPU with the diff, as any other change."""
    if type(test).__name__.endswith("CUDA"):
        for cuda, cpu in _CUDA_SPELLINGS:
            text = text.replace(cuda, cpu)
    return text


def expected_paths(test, name: str) -> tuple[Path, Path]:
    cls, method = _device_neutral(test)
    fname = f"{cls}.{method}.{name}.txt"
    major, minor = torch_major_minor()
    return EXPECTED_DIR / fname, EXPECTED_DIR / f"v{major}.{minor}" / fname


def assertExpectedGraph(test, text, name: str) -> None:
    """Compare a graph dump (str or GraphModule) with its expected file."""
    if isinstance(text, torch.fx.GraphModule):
        text = graph_text(text)
    text = _cpu_spelling(test, text.rstrip("\n") + "\n")
    shared, override = expected_paths(test, name)
    dump_dir = os.environ.get("TSRT_DUMP_DIR")
    if dump_dir:
        # every dump as produced, for cross-mode diffs (noxfile, verify_patches)
        Path(dump_dir).mkdir(parents=True, exist_ok=True)
        (Path(dump_dir) / shared.name).write_text(text)

    if _accepting():
        _accept(shared, override, text)
        return

    path = override if override.exists() else shared
    if not path.exists():
        test.fail(
            f"no expected graph {shared.relative_to(EXPECTED_DIR.parent)} "
            f"(record it with EXPECTTEST_ACCEPT=1); got:\n{text}"
        )
    expected = path.read_text()
    if text != expected:
        # not assertMultiLineEqual(text, expected): its diff shows the
        # expected lines as '+'; reviewers read expecttest's direction
        test.fail(
            f"graph {name!r} differs from {path.relative_to(EXPECTED_DIR.parent)} "
            "(EXPECTTEST_ACCEPT=1 records a per-version override):\n"
            + expected_first_diff(path, expected, text)
        )


def _accept(shared: Path, override: Path, text: str) -> None:
    """Record ``text``: into the shared file when there is none, else into
    the running torch's override unless the shared file already says it.
    When the running torch produces the shared text, its override is
    deleted: equal to the shared file it would override nothing (and keep a
    later change of the shared file from applying to this torch); different
    from it, it is stale."""
    if not shared.exists():
        shared.parent.mkdir(parents=True, exist_ok=True)
        shared.write_text(text)
    elif shared.read_text() != text:
        override.parent.mkdir(parents=True, exist_ok=True)
        if not (override.exists() and override.read_text() == text):
            override.write_text(text)
        return
    if override.exists():
        override.unlink()
        if not any(override.parent.iterdir()):
            override.parent.rmdir()


def assertExpectedGraphs(test, recorder, prefix: str = "") -> None:
    """Dump every graph an (Aot)EagerAndRecordGraphs recorder holds:
    ``dynamo.<i>``, ``aot_fw.<i>``, ``aot_bw.<i>``."""
    groups = [("dynamo", getattr(recorder, "graphs", []))]
    groups.append(("aot_fw", getattr(recorder, "fw_graphs", [])))
    groups.append(("aot_bw", getattr(recorder, "bw_graphs", [])))
    groups.append(("inductor", getattr(recorder, "inductor_graphs", [])))
    counts = "".join(f"{kind}: {len(graphs)}\n" for kind, graphs in groups)
    # the number of graphs is part of the expectation: a missing backward
    # graph must fail as loudly as a different one
    assertExpectedGraph(test, counts, f"{prefix}counts")
    for kind, graphs in groups:
        for i, gm in enumerate(graphs):
            assertExpectedGraph(test, gm, f"{prefix}{kind}.{i}")


# --------------------------------------------------------------------------
# structured trace (TORCH_TRACE / tlparse)


class captured_trace_artifacts:
    """Collect the ``trace_structured("artifact", ...)`` records emitted in
    the block as ``{name: [(encoding, payload), ...]}`` (what tlparse shows).

    ``trace_structured`` does nothing unless torch's trace logger has a
    handler, so one is attached for the block."""

    def __enter__(self) -> dict[str, list[str]]:
        import logging

        from torch._logging._internal import trace_log

        self.artifacts: dict[str, list[str]] = {}
        artifacts = self.artifacts

        class _Handler(logging.Handler):
            def emit(self, record):
                meta = getattr(record, "metadata", {}).get("artifact")
                if meta is not None:
                    artifacts.setdefault(meta["name"], []).append(
                        (meta["encoding"], record.payload)
                    )

        self._log = trace_log
        self._handler = _Handler()
        self._level = trace_log.level
        trace_log.addHandler(self._handler)
        trace_log.setLevel(logging.DEBUG)
        return artifacts

    def __exit__(self, *exc) -> None:
        self._log.removeHandler(self._handler)
        self._log.setLevel(self._level)


# --------------------------------------------------------------------------
# device parametrization


def instantiate_cpu_and_cuda(generic: type, scope: dict) -> None:
    """``instantiate_device_type_tests`` for cpu and cuda, and cuda variants
    listed as skips ("needs a CUDA GPU") where there is none: without a GPU
    torch leaves them out entirely, and a run should say what it did not do."""
    import unittest

    from torch.testing._internal.common_device_type import instantiate_device_type_tests

    name = generic.__name__
    instantiate_device_type_tests(generic, scope, only_for=("cpu", "cuda"))
    if f"{name}CUDA" not in scope:
        attrs = {}
        for test in dir(scope[f"{name}CPU"]):
            if test.startswith("test_") and test.endswith("_cpu"):

                def skipped(self):
                    pass

                skipped.__name__ = test[: -len("_cpu")] + "_cuda"
                attrs[skipped.__name__] = unittest.skip("needs a CUDA GPU")(skipped)
        from torch._dynamo.test_case import TestCase

        scope[f"{name}CUDA"] = type(f"{name}CUDA", (TestCase,), attrs)
    # instantiate_device_type_tests removes the generic class itself
    scope.pop(name, None)


# --------------------------------------------------------------------------
# a test file run as a script


def _main_is_a_test_file() -> bool:
    """Whether this process runs a test file of this folder as a script
    (``PYTHONPATH=test python test/runtime/test_x.py``; the folders hold
    no ``harness`` of their own): no conftest sets the mode there (Note [The
    mode is set before a test module runs])."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path:
        return False
    path = Path(path).resolve()
    return path.name.startswith("test_") and path.is_relative_to(Path(__file__).resolve().parent)


if _main_is_a_test_file():
    setup_mode()
