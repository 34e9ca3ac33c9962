"""The metadata marker for an opaque slot in the flat argument list.

``OpaqueMeta`` marks an attr of ``SubclassCreationMeta.attrs`` that is an
opaque reference object: it occupies exactly one slot of the flat argument
list (the object itself, fakeified while tracing), is not differentiable,
and has no tangent. An empty dataclass, so instances compare equal.

torch >= 2.12 defines it (``torch._functorch._aot_autograd.schemas``); there
the runtime uses torch's very class, also when ``install(force=True)``
replaces the runtime's functions. The marker is data that outlives a
process: the AOTAutogradCache pickles subclass metadata by the marker's
qualified name, and torch's own code (the generated subclass wrapper,
subclass parametrization) matches on its class. With a class of our own,
an entry saved in forced mode was loaded by native torch with the opaque
slots silently dropped (the generated wrapper matched no case for them),
and the compiled graph was called with too few inputs.

torch 2.11 has none; ``install()`` adds ours there (points/subclass_runtime.py).
Note [install() is transparent without opaques]: a new attribute; nothing
reads it on a path without opaques.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._torch_compat import has_native_support

if has_native_support():
    from torch._functorch._aot_autograd.schemas import OpaqueMeta
else:
    # Module-level on purpose: SubclassCreationMeta (which holds these in
    # ``attrs``) is pickled by AOTAutogradCache, and unpickling must be able
    # to import the class by its qualified name.
    @dataclass
    class OpaqueMeta:  # type: ignore[no-redef]
        """This attr of a subclass is an opaque reference object (one flat
        slot, no tangent). Same shape as torch >= 2.12's."""


__all__ = ["OpaqueMeta"]
