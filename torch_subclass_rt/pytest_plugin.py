"""pytest plugin behind ``python -m torch_subclass_rt compare``.

Loaded with ``-p torch_subclass_rt.pytest_plugin``; does nothing unless the
environment asks for it, so it is harmless anywhere:

``TSRT_COMPARE_INSTALL``
    ``1``: call ``install()`` before any test module is imported; ``force``:
    ``install(force=True)``. Spawned workers and subprocesses get the same
    through ``sitecustomize`` (see :mod:`torch_subclass_rt.compare`).
``TSRT_COMPARE_REPORT``
    a file to write every test's outcome to, as JSON
    (``{nodeid: [outcome, first error line]}``), when the session ends.
    Written by the controlling process only (with pytest-xdist the
    controller sees every worker's reports).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from .compare import REPORT_ENV, install_from_env

# worst first: the outcome a test gets is the worst of its phases
_RANK = {"error": 0, "failed": 1, "xpassed": 2, "xfailed": 3, "skipped": 4, "passed": 5}


def first_line(text: str) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()
    return ""


def _describe(excinfo: Any) -> str:
    return f"{excinfo.typename}: {first_line(str(excinfo.value))}".rstrip(": ")


class _Recorder:
    def __init__(self, path: str) -> None:
        self.path = path
        self.outcomes: dict[str, list[str]] = {}

    def record(self, nodeid: str, outcome: str, detail: str) -> None:
        held = self.outcomes.get(nodeid)
        if held is None or _RANK[outcome] < _RANK[held[0]]:
            self.outcomes[nodeid] = [outcome, detail]

    def pytest_runtest_logreport(self, report: Any) -> None:
        detail = dict(report.user_properties).get("tsrt_error", "")
        if not detail and report.longrepr is not None and not report.passed:
            detail = first_line(getattr(report, "longreprtext", "") or str(report.longrepr))
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        elif report.passed:
            if report.when != "call":
                return
            outcome = "passed"
        elif report.skipped:
            outcome = "skipped"
            if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
                detail = first_line(report.longrepr[2])
        else:
            outcome = "failed" if report.when == "call" else "error"
        self.record(report.nodeid, outcome, detail)

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            text = getattr(report, "longreprtext", "") or str(report.longrepr)
            lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
            self.record(report.nodeid or "<collection>", "error",
                        lines[0] if lines else first_line(text))

    def pytest_sessionfinish(self, session: Any) -> None:
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.outcomes, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    # The report carries only the formatted traceback; keep the exception's
    # own first line on it for the summary (also in xdist workers, whose
    # reports travel to the controller with their user_properties).
    result = yield
    if call.excinfo is not None and os.environ.get(REPORT_ENV):
        result.get_result().user_properties.append(("tsrt_error", _describe(call.excinfo)))


def pytest_configure(config: Any) -> None:
    install_from_env()
    path = os.environ.get(REPORT_ENV)
    if path and not hasattr(config, "workerinput"):  # not an xdist worker
        config.pluginmanager.register(_Recorder(path), "tsrt_compare_recorder")
