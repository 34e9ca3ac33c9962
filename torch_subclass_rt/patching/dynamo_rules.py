"""A replacement is traced by Dynamo as torch's original is.

Note [Replacements keep the original's trace rule]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Dynamo decides per function whether to inline it into a graph or to skip
it (a graph break, the call runs eagerly), by the function object
(``torch._dynamo.trace_rules.lookup``) and, for a frame it meets outside a
trace, by its code's file (``trace_rules.check``). Most of torch's internals
are skipped because their files are under ``torch/``; our replacements live
in ``torch_subclass_rt/`` (or, for a source edit, in a generated file), which
Dynamo inlines. Left alone, user code that reaches a patched function while
being traced (``is_fake``, ``maybe_get_fake_mode``, a NestedTensor's
``maybe_mark_dynamic``) would have our code inlined where torch's graph-breaks:
another graph, or an error where stock torch falls back to eager.

So :func:`keep_trace_rule` gives every replacement its original's rule when
the registry builds it (``registry.plan``): where torch's is skipped, each
function of ours in the replacement is marked with ``torch._dynamo.skip``,
which is how torch itself marks a function to skip without inlining it: its
code's frames are skipped and the frames it calls are still looked at (as for
a skipped torch file), and the tracer graph-breaks on a call to it. Nothing
wraps it: the function, its source, its traceback lines and ``__wrapped__``
stay as they were. A replacement whose original Dynamo inlines is inlined
already. A point that adds an attribute gets the rule of the file of the
module it is added to (what torch's rule for it would be had it been
written there).

The originals' rules are looked up before anything is replaced, which also
builds Dynamo's by-name rule map from torch's own objects (built while
installed, it would record our replacements under torch's names and keep
them after uninstall).

``test/patching/test_trace_rules.py`` checks every point of every mode on the torch it
runs on.
"""

from __future__ import annotations

import sys
import types
from typing import Any

#: the rule of a function Dynamo skips (graph break, runs eagerly)
SKIP = "skip"
#: the rule of a function Dynamo inlines into the graph it traces
INLINE = "inline"


def functions_of(obj: Any) -> list[types.FunctionType]:
    """The Python functions an attribute value runs as: itself, a
    static/class method's or a property's functions, a class's own
    methods (not inherited ones)."""
    if isinstance(obj, (staticmethod, classmethod)):
        return functions_of(obj.__func__)
    if isinstance(obj, property):
        return [f for acc in (obj.fget, obj.fset, obj.fdel) for f in functions_of(acc)]
    if isinstance(obj, types.FunctionType):
        return [obj]
    if isinstance(obj, type):
        return [f for v in vars(obj).values() if not isinstance(v, type) for f in functions_of(v)]
    return []


def _classify(rule: Any) -> str:
    from torch._dynamo.variables import SkipFunctionVariable, UserFunctionVariable

    if rule is SkipFunctionVariable:
        return SKIP
    if isinstance(rule, type) and issubclass(rule, UserFunctionVariable):
        return INLINE
    # TorchInGraphFunctionVariable, BuiltinVariable, ...: no replacement of
    # ours can have these; the test reports a point that meets one
    return getattr(rule, "__name__", repr(rule))


def rule_of(fn: Any) -> str:
    """Dynamo's rule for a function: ``SKIP`` for one it skips (by
    ``trace_rules.lookup``, or marked with ``torch._dynamo.skip`` /
    wrapped in ``torch._dynamo.disable``), else ``INLINE`` (or another
    rule's class name)."""
    from torch._dynamo import trace_rules

    if getattr(fn, "_torchdynamo_disable", False):
        return SKIP
    return _classify(trace_rules.lookup(fn))


def file_rule(filename: str) -> str:
    """Dynamo's rule for a function defined in ``filename`` that no rule
    names (``lookup``'s last step, for a direct call)."""
    from torch._dynamo import trace_rules

    return SKIP if trace_rules.check_file(filename, True).skipped else INLINE


def expected_rule(original: Any, module_name: str) -> str | None:
    """The rule a replacement of ``original`` (an attribute of module
    ``module_name``; ``None`` when the point adds it) must have, or None
    for a value that is not code (a dict, a constant)."""
    if isinstance(original, type) or original is None:
        module = sys.modules.get(getattr(original, "__module__", None) or module_name)
        filename = getattr(module, "__file__", None)
        return file_rule(filename) if filename else None
    fns = functions_of(original)
    # a property: the rule of its getter
    return rule_of(fns[0]) if fns else None


def keep_trace_rule(replacement: Any, expected: str | None) -> list[types.FunctionType]:
    """Mark the functions of ``replacement`` that Dynamo would inline where
    the original is skipped (``expected == SKIP``); returns them."""
    if expected != SKIP:
        return []
    from torch._dynamo.decorators import skip

    marked = []
    for fn in functions_of(replacement):
        if rule_of(fn) == INLINE:
            skip(fn)
            marked.append(fn)
    return marked
