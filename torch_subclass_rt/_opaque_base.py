"""``OpaqueBase`` for torch 2.10, which has no ``torch._opaque_base``.

torch 2.11 added ``torch._opaque_base.OpaqueBase``: the base class of opaque
types, whose metaclass makes ``isinstance(fake, Mesh)`` true for the
``FakeScriptObject`` that stands in for a ``Mesh`` while tracing. Every
"is this flatten attr an opaque?" question in torch 2.12's code and in ours
(``_torch_compat.is_opaque_attr``) is that instance check, so on 2.10 the
package ships the same pair of classes, and ``tsrt.OpaqueBase`` is this one.
``tsrt.register_opaque`` requires it on 2.10, as 2.11's
``register_opaque_type`` requires 2.11's.

Note [OpaqueBase on torch 2.10]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The instance check below, torch 2.11's
``OpaqueBaseMeta.__instancecheck__`` and the ``torch/_opaque_base.py``
that patch 0000 of the v2.10.0 series adds must answer alike. Unlike
2.11's, this one and the series' read ``real_obj`` without
``FakeScriptObject.__getattribute__`` (whose failure message is about fake
kernels) and answer False for a fake without a real object: 2.10's own
``maybe_to_fake_obj`` makes those until ``install()`` gives it one.
"""

from __future__ import annotations


class OpaqueBaseMeta(type):
    def __instancecheck__(cls, instance: object) -> bool:
        if super().__instancecheck__(instance):
            return True
        from torch._library.fake_class_registry import FakeScriptObject

        if not isinstance(instance, FakeScriptObject):
            return False
        real = object.__getattribute__(instance, "real_obj")
        return real is not None and super().__instancecheck__(real)


class OpaqueBase(metaclass=OpaqueBaseMeta):
    """Base class of opaque types on torch 2.10 (``tsrt.OpaqueBase``)."""
