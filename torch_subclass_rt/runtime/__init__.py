"""Our AOTAutograd subclass runtime with opaque attrs (no patching in here).

``flatten`` builds subclass metadata and unwraps subclass arguments into the
flat list (inner tensors, opaques, symints); ``wrap`` rebuilds subclasses from
that list; ``tangents`` prepares runtime tangents for the backward. Opaques take
one slot in the flat list, marked by :class:`~.meta.OpaqueMeta`.
See Note [Opaque attrs in the flat argument list] in ``flatten``.
"""

from .meta import OpaqueMeta

__all__ = ["OpaqueMeta"]
