"""Build a modified copy of a torch function from its source text.

Used where a long torch function needs a small change in its middle and no
hook exists (e.g. skipping opaque attrs inside a loop). Each edit is an exact
text replacement that must match the expected number of times, so a torch
release whose source differs makes the point fail to *build* and the whole
install is refused; nothing is ever half-edited.

The copy is compiled with ``from __future__ import annotations`` (annotations
are not evaluated at definition time) and executed against the original
module's globals, so it sees the same imports, including names that other
points rebind later. Free variables (a zero-argument ``super()``'s
``__class__`` cell, closures) are re-created through a factory function.
Decorators on the original are not re-applied; points that use this module
only target undecorated functions and methods.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from .registry import PatchError


class Edit:
    """Replace ``old`` by ``new``; ``count`` is how often ``old`` must occur."""

    def __init__(self, old: str, new: str, count: int = 1) -> None:
        self.old = textwrap.dedent(old).strip("\n")
        self.new = textwrap.dedent(new).strip("\n")
        self.count = count


def _reindent(block: str, indent: str) -> str:
    lines = block.split("\n")
    return "\n".join(lines[:1] + [indent + line if line else line for line in lines[1:]])


def _apply_edit(source: str, edit: Edit, where: str) -> str:
    # Edits are written dedented; match them at whatever indentation the
    # first line has in the function, and re-indent the replacement to it.
    first = edit.old.split("\n")[0]
    hits = []
    start = 0
    while True:
        i = source.find(first, start)
        if i < 0:
            break
        line_start = source.rfind("\n", 0, i) + 1
        indent = source[line_start:i]
        if indent.strip() == "" and source.startswith(_reindent(edit.old, indent), i):
            hits.append((i, indent))
        start = i + 1
    if len(hits) != edit.count:
        raise PatchError(
            f"{where}: expected {edit.count} match(es) of {first.strip()!r}, "
            f"found {len(hits)}; this torch's source differs from the one the "
            "point was written for"
        )
    for i, indent in reversed(hits):
        old = _reindent(edit.old, indent)
        source = source[:i] + _reindent(edit.new, indent) + source[i + len(old):]
    return source


def edited_function(func: Callable[..., Any], edits: Sequence[Edit]) -> Callable[..., Any]:
    """A new function: ``func``'s source with ``edits`` applied."""
    where = f"{func.__module__}.{func.__qualname__}"
    try:
        source = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError) as e:
        raise PatchError(f"{where}: no Python source available ({e})") from e
    lines = source.split("\n")
    while lines and lines[0].lstrip().startswith("@"):
        lines.pop(0)  # decorators are not re-applied (see module docstring)
    source = "\n".join(lines)
    for edit in edits:
        source = _apply_edit(source, edit, where)

    freevars = func.__code__.co_freevars
    name = func.__name__
    factory = "__tsrt_make__"
    body = textwrap.indent(source, "    ")
    text = (
        "from __future__ import annotations\n"
        f"def {factory}({', '.join(freevars)}):\n{body}\n    return {name}\n"
    )
    filename = f"<torch_subclass_rt edit of {where}>"
    namespace: dict[str, Any] = {}
    code = compile(text, filename, "exec", dont_inherit=True)
    exec(code, func.__globals__, namespace)  # noqa: S102 - our own edited torch source
    cells = [c.cell_contents for c in (func.__closure__ or ())]
    new = namespace[factory](*cells)
    new.__qualname__ = func.__qualname__
    new.__module__ = func.__module__
    new.__doc__ = func.__doc__
    new.__defaults__ = func.__defaults__
    new.__kwdefaults__ = func.__kwdefaults__
    new.__wrapped_torch_original__ = func  # type: ignore[attr-defined]
    return new
