"""The modes torch_subclass_rt runs torch in, spelled in one place.

``install()`` reports one (``Status.mode``), patch points declare the ones
they belong to (``PatchPoint.modes``), and the test harness, the tools and
``python -m torch_subclass_rt demo --mode`` read one from ``TSRT_MODE`` or
the command line. Before this enum each of them kept its own set of strings.

A ``str`` enum on purpose: a member *is* its string, so ``st.mode ==
"backport"``, ``TSRT_MODE=backport``, JSON and pickles of a ``Status`` keep
working unchanged, and it prints as the bare string it always printed
(``str``/``format``/``repr`` of a member are those of its value).
"""

from __future__ import annotations

import enum


class Mode(str, enum.Enum):
    # Declaration order is the order error messages list them in.

    #: torch >= 2.12 as shipped; install() patches nothing
    NATIVE = "native"
    #: a native release patched only with the later upstream fixes it lacks
    #: (the points with ``upstream_fix``; Note [Upstream fixes] in ``points/__init__.py``)
    NATIVE_FIXES = "native+fixes"
    #: torch 2.11: our runtime and the patch points give it the feature
    BACKPORT = "backport"
    #: torch 2.13 with ``install(force=True)``: our runtime replaces the
    #: native one (and carries the fixes)
    FORCED = "forced"
    #: torch 2.11 with the in-tree patch series applied to its sources; a
    #: test-harness mode only (nothing is installed, install() never reports it)
    PATCHED = "patched"
    #: nothing installed (``Status.mode`` before install() / after uninstall())
    OFF = "off"

    # Print as the plain string, as the modes did before they were an enum
    # (Python 3.12 changed format() of mixed-in enums to the member name).
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __repr__(self) -> str:
        return repr(self.value)


#: modes in which install() applies patch points (``PatchPoint.modes``)
POINT_MODES = frozenset({Mode.BACKPORT, Mode.FORCED, Mode.NATIVE_FIXES})
#: modes in which opaque attrs work under torch.compile (``Status.active``)
ACTIVE_MODES = frozenset({Mode.BACKPORT, Mode.NATIVE, Mode.NATIVE_FIXES, Mode.FORCED})
#: modes the test suites run in (``TSRT_MODE``)
TEST_MODES = tuple(m for m in Mode if m is not Mode.OFF)
