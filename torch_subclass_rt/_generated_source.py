"""Generated and edited Python source that debugs like torch's own.

``exec`` of a source string loses the text: a traceback through the resulting
function shows file and line but no code, pdb cannot list it, and
``inspect.getsource`` fails. torch.fx solves this for its generated
``forward`` by putting the text into ``linecache`` under a made-up file name;
we do the same, here, for everything this package compiles from a string:
the per-call wrappers generated at run time (``runtime/codegen.py``,
``runtime/grad_codegen.py``) and the torch functions we rebuild from edited
source (``patching/source_edit.py``).

The file name of an entry ends in a digest of its text
(:func:`source_filename`), so compiling the same text again (every
``install()`` rebuilds the same edits; many compiled functions get the same
wrapper) reuses the one entry: the cache grows with the number of *distinct*
texts, like FX's one entry per generated module, and never holds two texts
under one name (a traceback always shows the lines that were compiled).
Entries are never removed: ``uninstall()`` has nothing to undo, and a
function built while installed that outlives it still shows its source.
"""

from __future__ import annotations

import hashlib
import linecache
import logging
from collections.abc import Callable
from typing import Any


def source_filename(stem: str, source: str) -> str:
    """A file name for ``source``: ``stem`` plus a digest of the text.

    A stem of the form ``<...>`` keeps that form (the digest goes inside the
    brackets): ``linecache.lazycache`` ignores such names, so it never tries
    to load them from the code's module globals (torch's module, whose
    ``__loader__`` would hand back torch's own file)."""
    digest = hashlib.sha1(source.encode("utf-8")).hexdigest()[:12]
    if stem.startswith("<") and stem.endswith(">"):
        return f"{stem[:-1]} #{digest}>"
    return f"{stem}#{digest}"


def register_source(filename: str, source: str) -> None:
    """Make ``source`` the text ``linecache`` (tracebacks, pdb, inspect)
    returns for ``filename``."""
    # mtime None: linecache.checkcache() does not stat such an entry (there is
    # no file), so it survives every traceback's cache check.
    linecache.cache[filename] = (
        len(source),
        None,
        source.splitlines(keepends=True),
        filename,
    )


def compile_source(
    source: str, stem: str, globals: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """``exec`` ``source`` (registered with linecache first) with ``globals``;
    returns the namespace its definitions went into and its file name.

    Definitions go into a fresh dict, not into ``globals`` (which may be a
    torch module's own)."""
    filename = source_filename(stem, source)
    register_source(filename, source)
    code = compile(source, filename, "exec", dont_inherit=True)
    namespace: dict[str, Any] = {}
    exec(code, globals, namespace)  # noqa: S102 - our own generated/edited source
    return namespace, filename


def build_generated_function(
    source: str,
    name: str,
    env: dict[str, Any],
    *,
    stem: str,
    log: logging.Logger,
    title: str,
    artifact: str,
) -> Callable[..., Any]:
    """Compile the generated function ``name`` from ``source`` with globals
    ``env``, after showing the text where torch shows its generated code:
    ``log`` at DEBUG (``"<title>:\\n<source>"``) and a ``trace_structured``
    artifact ``artifact`` (TORCH_TRACE / tlparse), next to the graphs of the
    compile that asked for it."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s:\n%s", title, source)
    _trace_artifact(artifact, source)
    namespace, _filename = compile_source(source, stem, env)
    return namespace[name]


def _trace_artifact(name: str, source: str) -> None:
    from torch._logging import trace_structured

    trace_structured(
        "artifact",
        metadata_fn=lambda: {"name": name, "encoding": "string"},
        payload_fn=lambda: source,
        # the grad wrapper is built at the first backward, outside any compile
        expect_trace_id=False,
    )
