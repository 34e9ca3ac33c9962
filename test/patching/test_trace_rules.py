"""Dynamo traces every replacement as it traces torch's original.

Note [Replacements keep the original's trace rule] (patching/dynamo_rules.py):
where Dynamo skips torch's function (a graph break; it runs eagerly), it must
skip ours, and where it inlines torch's it must inline ours. Checked for every
point of every mode this torch has (backport on 2.10/2.11; forced and
native+fixes on 2.13; native+fixes on 2.12.x/2.14.x), whatever TSRT_MODE this
session runs in: the replacements are built (``registry.plan``, which touches
nothing) from torch as shipped, with nothing installed.

The rules are Dynamo's own: ``torch._dynamo.trace_rules.lookup`` of the
function, and a function wrapped in ``torch._dynamo.disable`` or marked with
``torch._dynamo.skip`` counts as skipped. A point that adds an attribute has
the rule of the file of the module it is added to.
"""

from __future__ import annotations

import contextlib
import sys

import pytest
import torch
import torch._dynamo
from torch._dynamo import trace_rules
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

import torch_subclass_rt as tsrt
from torch_subclass_rt import _torch_compat
from torch_subclass_rt._modes import Mode
from torch_subclass_rt.patching import registry
from torch_subclass_rt.patching.dynamo_rules import functions_of
from torch_subclass_rt.points import all_points

VERSION = tsrt.status().torch_version
_KNOWN = all_points()
_GROUPS = {p.group for p in _KNOWN if p.group}
#: the modes install() can choose on this torch, with their points
MODES = {
    mode: registry.select(_KNOWN, VERSION, mode, _GROUPS)
    for mode, versions in (
        (Mode.BACKPORT, _torch_compat.BACKPORT_VERSIONS),
        (Mode.FORCED, _torch_compat.FORCED_VERSIONS),
        (Mode.NATIVE_FIXES, _torch_compat.FIXES_VERSIONS),
    )
    if VERSION in versions
}
CASES = [(m, p.name) for m, pts in MODES.items() for p in pts]


@contextlib.contextmanager
def _nothing_installed():
    """torch as shipped for the block; then the install state before it."""
    before, groups = tsrt.status().mode, tsrt._groups
    tsrt.uninstall()
    try:
        yield
    finally:
        if before != Mode.OFF:
            tsrt.install(force=(before == Mode.FORCED), dtensor="dtensor" in groups)


_plans: dict[Mode, dict[str, registry._Plan]] = {}


def _plans_of(mode: Mode) -> dict[str, registry._Plan]:
    if mode not in _plans:
        with _nothing_installed():
            _plans[mode] = {p.point.name: p for p in registry.plan(MODES[mode])}
    return _plans[mode]


def _rule(fn) -> str:
    """Dynamo's verdict on a function: its trace rule's class name, a
    disabled (or ``torch._dynamo.skip``-marked) function counted as skipped."""
    if getattr(fn, "_torchdynamo_disable", False):
        return "SkipFunctionVariable"
    rule = trace_rules.lookup(fn)
    return getattr(rule, "__name__", repr(rule))


def _torch_rule(plan: registry._Plan, stacked_on: registry._Plan | None) -> str | None:
    """The rule of what torch has at the point's target (None: not code)."""
    if stacked_on is not None:
        return _torch_rule(stacked_on, None)
    original = plan.original
    if original is registry._MISSING or isinstance(original, type):
        # an added attribute (or a class): what torch's rule would be for a
        # function written in that module's file
        mod = getattr(original, "__module__", None) or plan.point.module_name
        skipped = trace_rules.check_file(sys.modules[mod].__file__, True).skipped
        return "SkipFunctionVariable" if skipped else "UserFunctionVariable"
    fns = functions_of(original)
    return _rule(fns[0]) if fns else None


@pytest.mark.skipif(not CASES, reason=f"torch {VERSION}: install() has no patch points")
@pytest.mark.parametrize(("mode", "name"), CASES, ids=[f"{m.value}-{n}" for m, n in CASES])
def test_replacement_has_torchs_trace_rule(mode, name):
    plans = _plans_of(mode)
    plan = plans[name]
    below = [
        p for p in plans.values()
        if p.point.target == plan.point.target and p is not plan
        and list(plans).index(p.point.name) < list(plans).index(name)
    ]
    want = _torch_rule(plan, below[0] if below else None)
    fns = functions_of(plan.replacement)
    if plan.original is registry._MISSING and not fns:
        return  # an added value (a dataclass field's default): no code
    if want is None or not fns:
        assert want is None and not fns, (
            f"{name}: torch's {plan.point.target} is "
            f"{'code' if want else 'not code'}, the replacement "
            f"{'is' if fns else 'is not'}"
        )
        return
    got = {f"{f.__module__}.{f.__qualname__}": _rule(f) for f in fns}
    wrong = {k: v for k, v in got.items() if v != want}
    assert not wrong, (
        f"{name} ({mode}): Dynamo's rule for torch's {plan.point.target} is {want}, "
        f"for the replacement's {wrong}; Dynamo would trace ours differently "
        "(Note [Replacements keep the original's trace rule])"
    )


@pytest.mark.skipif(not CASES, reason=f"torch {VERSION}: install() has no patch points")
@pytest.mark.parametrize("mode", list(MODES), ids=[m.value for m in MODES])
def test_skipped_code_is_not_shared_with_inlined_code(mode):
    # torch._dynamo.skip marks the *code* (every function made from one
    # `def` shares it): a replacement that must be inlined cannot share
    # code with one that is skipped
    skipped, inlined = {}, {}
    for name, plan in _plans_of(mode).items():
        for f in functions_of(plan.replacement):
            (skipped if _rule(f) == "SkipFunctionVariable" else inlined)[f.__code__] = name
    shared = {inlined[c]: skipped[c] for c in skipped.keys() & inlined.keys()}
    assert not shared, f"points whose replacements share code but not a trace rule: {shared}"


def _frames_of_compiled_is_fake() -> tuple[int, int]:
    """(graphs, frames Dynamo looked at) compiling a function that calls
    ``is_fake`` (which torch skips: a graph break)."""
    import torch._subclasses.fake_tensor as fake_tensor

    torch._dynamo.reset()
    counters.clear()
    cnt = CompileCounter()

    @torch.compile(backend=cnt)
    def f(x):
        y = x.sin()
        if fake_tensor.is_fake(y):
            y = y + 1
        return y.cos()

    f(torch.randn(3))
    return cnt.frame_count, counters["frames"]["total"]


@pytest.mark.skipif(
    not any(p.name == "fake_tensors.is_fake" for p in MODES.get(Mode.BACKPORT, ())),
    reason=f"torch {VERSION}: no backport of is_fake here (torch 2.10/2.11 only)",
)
def test_skipped_replacement_runs_like_torchs_in_a_compiled_function():
    # ours must graph-break where torch's does and, run eagerly after the
    # break, not be compiled as a frame of its own (torch's file is skipped)
    with _nothing_installed():
        stock = _frames_of_compiled_is_fake()
        with tsrt.installed():
            ours = _frames_of_compiled_is_fake()
    assert ours == stock, (
        f"(graphs, frames) compiling a call to is_fake: stock torch {stock}, installed {ours}"
    )
