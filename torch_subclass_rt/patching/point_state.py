"""State one patch point leaves for another: the one place it lives.

Note [State between points]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
A few points tell code of another point something about one of torch's
objects while a compile runs: the edited ``VariableBuilder.wrap_tensor``
marks the builder of a subclass input's inner attr, which the edited
``VariableBuilder._wrap`` then wraps as an opaque graph input. Such state
lives here, in a :class:`SideTable` keyed by the torch object (held weakly:
an entry dies with its object), never as an attribute set on the object.
So torch's objects keep exactly their own attributes, every piece of state
names the points that write and read it, and a reader's point declares
``requires=`` its writer's (``PatchPoint.requires``: install() refuses the
reader without the writer, and the ablation leaves both out together).
test/patching/test_point_state.py checks the tables against the registry.

One kind of state cannot live here: a value that refers back to its object.
A trace's proxies refer to their tracer, so a table entry would keep the
tracer alive for good; ``points/tracing.py`` keeps its map of real objects to
proxies on the tracer (a cycle the collector frees with the trace), written
and read by that one change's points (``fx.set_proxy_slot`` and
``fx.get_proxy_slot``, which requires it). Nor can state that must be saved
with torch's object: the opaque-reads record travels inside a pickled
AOTAutograd cache entry, as one attribute of the entry
(``points/opaque_reads.py``, ``ENTRY_ATTR``), written by
``aot_autograd.AOTAutogradCache.save.opaque_reads`` and read by
``inductor.GuardedCache.iterate_over_candidates.opaque_reads``.
"""

from __future__ import annotations

import weakref
from typing import Any

_MISSING = object()


class SideTable:
    """Values attached to live objects, by identity (an object's ``__eq__``
    and ``__hash__`` are never called: a frozen dataclass hashes its
    fields); an entry goes when its object is collected."""

    def __init__(self, what: str, written_by: tuple[str, ...], read_by: tuple[str, ...]) -> None:
        #: what a value means (for a reader of the code)
        self.what = what
        #: the point names whose code sets entries, and whose code reads them
        self.written_by = written_by
        self.read_by = read_by
        self._entries: dict[int, tuple[weakref.ref, Any]] = {}

    def _forget(self, key: int):
        entries = self._entries

        def forget(_ref: weakref.ref) -> None:
            entries.pop(key, None)

        return forget

    def set(self, obj: Any, value: Any) -> None:
        key = id(obj)
        self._entries[key] = (weakref.ref(obj, self._forget(key)), value)

    def get(self, obj: Any, default: Any = None) -> Any:
        entry = self._entries.get(id(obj))
        if entry is None or entry[0]() is not obj:
            return default
        return entry[1]

    def setdefault(self, obj: Any, value: Any) -> Any:
        found = self.get(obj, _MISSING)
        if found is _MISSING:
            self.set(obj, value)
            return value
        return found

    def __len__(self) -> int:
        return len(self._entries)


#: VariableBuilder -> True: the builder of a subclass input's inner attr, so
#: a registered DeviceMesh / ProcessGroup it wraps becomes an opaque graph
#: input (torch 2.13's path), not 2.11's constant variable
OPAQUE_ATTR_BUILDERS = SideTable(
    "the VariableBuilder wraps an inner attr of a subclass input",
    written_by=("dynamo.VariableBuilder.wrap_tensor",),
    read_by=("dynamo.VariableBuilder._wrap",),
)

#: MetaTensorDesc -> {attr: real opaque}: the opaque inner attrs of a
#: described subclass, handed to __tensor_unflatten__ when it is fakeified
DESC_OPAQUE_ATTRS = SideTable(
    "the opaque inner attrs of a described subclass tensor",
    written_by=("fake_tensors.MetaTensorDescriber.describe_tensor",),
    read_by=("fake_tensors.MetaConverter.meta_tensor",),
)

TABLES = (OPAQUE_ATTR_BUILDERS, DESC_OPAQUE_ATTRS)
