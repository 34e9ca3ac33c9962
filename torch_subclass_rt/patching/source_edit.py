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
A decorated target is refused (:class:`PatchError`): the copy is the bare
function, and silently dropping a decorator would change what torch runs.

How edited code reaches torch_subclass_rt (one way only)
--------------------------------------------------------
An edit's new text calls our helpers as ``__tsrt__.<name>(...)`` and in no
other way: ``__tsrt__`` is the module :data:`HELPERS_MODULE`
(``points/_edit_api.py``, which lists every helper edited code may call),
bound as a closure variable of the copy by the factory function, so torch's
module globals are never written to and nothing is imported per call. At
build time an edit whose text mentions ``torch_subclass_rt`` (an import,
``__import__``) or ``__tsrt__.<name>`` for a name the module lacks is refused.
Torch's own names are reached as torch's code reaches them: through the
module's globals, or as a ``torch.``-qualified attribute where the module
does not import the name.

Debugging
---------
The compiled text is registered with ``linecache`` under the file name
``<torch_subclass_rt edit of <module>.<qualname> #<digest>>``
(``_generated_source``), so a traceback, pdb or ``inspect.getsource``
through the copy shows the *edited* lines. The copy carries an
:class:`EditedSource` (:func:`edited_source_of`): torch's source and the
edited one, whose :meth:`EditedSource.diff` is what
``test/expected/source_edits/<point name>.diff`` records for review.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._generated_source import compile_source
from .registry import PatchError

#: the name edited code calls our helpers through, and the module bound to it
HELPERS_NAME = "__tsrt__"
HELPERS_MODULE = "torch_subclass_rt.points._edit_api"

_FACTORY = "__tsrt_make__"
_HELPER_USE = re.compile(r"\b__tsrt__\.([A-Za-z_]\w*)")


class Edit:
    """Replace ``old`` by ``new``; ``count`` is how often ``old`` must occur."""

    def __init__(self, old: str, new: str, count: int = 1) -> None:
        self.old = textwrap.dedent(old).strip("\n")
        self.new = textwrap.dedent(new).strip("\n")
        self.count = count


@dataclass(frozen=True)
class EditedSource:
    """What an edited function was built from (kept on it for review and
    debugging; the registry keeps the original *object* for uninstall)."""

    #: ``<module>.<qualname>`` of the torch function
    target: str
    #: torch's source of it, dedented
    original: str
    #: the same after the edits: the function as compiled
    edited: str
    #: the linecache file name of the compiled text
    filename: str

    def diff(self) -> str:
        """Unified diff, torch's source first; line numbers count from the
        ``def`` line."""
        lines = difflib.unified_diff(
            _lines(self.original),
            _lines(self.edited),
            fromfile=f"{self.target} (torch)",
            tofile=f"{self.target} (edited by torch_subclass_rt)",
        )
        return "".join(lines)


def _lines(text: str) -> list[str]:
    return (text if text.endswith("\n") else text + "\n").splitlines(keepends=True)


def edited_source_of(fn: Any) -> EditedSource | None:
    """The :class:`EditedSource` of a function built by :func:`edited_function`
    (None for anything else, including a ``functools.wraps`` wrapper of one,
    which copies the attribute but runs its own code). A staticmethod is
    looked through (``strip_staticmethod``)."""
    if isinstance(fn, staticmethod):
        fn = fn.__func__
    record = getattr(fn, "__tsrt_edited_source__", None)
    code = getattr(fn, "__code__", None)
    if record is None or code is None or code.co_filename != record.filename:
        return None
    return record


def _string_continuation_lines(source: str) -> set[int]:
    """The 0-based numbers of the lines of ``source`` that continue a
    multi-line string literal: their leading whitespace is the string's
    content, not indentation (torch 2.10's ``CodeGen._gen_python_code``
    builds the generated module from an f-string whose lines start at
    column 0)."""
    import io
    import tokenize

    inside: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
                # tokenize counts lines from 1; the first line holds the opening quote
                inside.update(range(tok.start[0], tok.end[0]))
    except (tokenize.TokenError, IndentationError):
        return set()
    return inside


def _dedent_code(source: str) -> str:
    """``textwrap.dedent`` for code: the common indentation of the lines
    that are code, removed from those lines only (a string literal's
    continuation lines keep their text, and do not stop the dedent)."""
    lines = source.split("\n")
    inside = _string_continuation_lines(source)
    code = [line for i, line in enumerate(lines) if i not in inside and line.strip()]
    if not code:
        return source
    margin = min(len(line) - len(line.lstrip()) for line in code)
    return "\n".join(
        line if i in inside else line[margin:] for i, line in enumerate(lines)
    )


def _indent_code(source: str, prefix: str) -> str:
    """``textwrap.indent`` for code: a string literal's continuation lines
    are left as they are (indenting them would change the string)."""
    inside = _string_continuation_lines(source)
    return "\n".join(
        prefix + line if line.strip() and i not in inside else line
        for i, line in enumerate(source.split("\n"))
    )


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


def _check_helper_use(edit: Edit, where: str, helpers: Any) -> None:
    """Refuse an edit that reaches our package other than via ``__tsrt__``."""
    if "torch_subclass_rt" in edit.new:
        raise PatchError(
            f"{where}: an edit's new text names torch_subclass_rt; edited code "
            f"calls our helpers only as {HELPERS_NAME}.<name> ({HELPERS_MODULE})"
        )
    for name in _HELPER_USE.findall(edit.new):
        if not hasattr(helpers, name):
            raise PatchError(
                f"{where}: an edit calls {HELPERS_NAME}.{name}, which "
                f"{HELPERS_MODULE} does not provide"
            )


def edited_function(
    func: Callable[..., Any], edits: Sequence[Edit], *, strip_staticmethod: bool = False
) -> Callable[..., Any]:
    """A new function: ``func``'s source with ``edits`` applied.

    ``strip_staticmethod``: ``func`` is the function of a ``@staticmethod``
    (its source starts with that decorator, which is the one decorator whose
    loss the caller can undo): the copy is the bare function, and the caller
    wraps it in ``staticmethod()`` again."""
    where = f"{func.__module__}.{func.__qualname__}"
    try:
        source = _dedent_code(inspect.getsource(func))
    except (OSError, TypeError) as e:
        raise PatchError(f"{where}: no Python source available ({e})") from e
    if strip_staticmethod:
        if not source.startswith("@staticmethod\n"):
            raise PatchError(f"{where}: expected a @staticmethod's function")
        source = source[len("@staticmethod\n"):]
    if source.lstrip().startswith("@"):
        decorator = source.lstrip().split("\n", 1)[0]
        raise PatchError(
            f"{where} is decorated ({decorator}); an edited copy would be the bare "
            "function without it. Edit the undecorated function the decorator "
            "wraps, or replace the callable as a whole"
        )
    helpers = importlib.import_module(HELPERS_MODULE)
    original = source
    for edit in edits:
        _check_helper_use(edit, where, helpers)
        source = _apply_edit(source, edit, where)

    freevars = func.__code__.co_freevars
    name = func.__name__
    body = _indent_code(source, "    ")
    # The factory's parameters become the copy's closure cells: torch's own
    # free variables, and __tsrt__ (see the module docstring).
    params = ", ".join((HELPERS_NAME, *freevars))
    text = (
        "from __future__ import annotations\n"
        f"def {_FACTORY}({params}):\n{body}\n    return {name}\n"
    )
    namespace, filename = compile_source(
        text, f"<torch_subclass_rt edit of {where}>", func.__globals__
    )
    cells = [c.cell_contents for c in (func.__closure__ or ())]
    new = namespace[_FACTORY](helpers, *cells)
    new.__qualname__ = func.__qualname__
    new.__module__ = func.__module__
    new.__doc__ = func.__doc__
    # torch's default objects, not the copy's re-evaluated ones (a default
    # that is a function another point replaces must stay the original);
    # a parameter an edit adds keeps the default the edit gave it
    if len(new.__defaults__ or ()) == len(func.__defaults__ or ()):
        new.__defaults__ = func.__defaults__
    if new.__kwdefaults__ or func.__kwdefaults__:
        new.__kwdefaults__ = {**(new.__kwdefaults__ or {}), **(func.__kwdefaults__ or {})}
    new.__tsrt_edited_source__ = EditedSource(  # type: ignore[attr-defined]
        target=where, original=original, edited=source, filename=filename
    )
    return new
