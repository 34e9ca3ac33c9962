"""Metadata markers for the flat argument list."""

from __future__ import annotations

from dataclasses import dataclass


# Module-level on purpose: SubclassCreationMeta (which holds these in
# ``attrs``) is pickled by AOTAutogradCache, and unpickling must be able to
# import the class by its qualified name.
@dataclass
class OpaqueMeta:
    """This attr of a subclass is an opaque reference object.

    It occupies exactly one slot of the flat argument list (the object itself,
    fakeified while tracing), is not differentiable, and has no tangent.
    Same shape as upstream's ``torch._functorch._aot_autograd.schemas.OpaqueMeta``
    (torch >= 2.12): an empty dataclass, so instances compare equal.
    """
