"""Catch-up: a value-type opaque's attributes read in compiled code on 2.11.

What torch 2.12.0 has and 2.11.0 lacks, for the backport on 2.11 (2.10's
Dynamo already reads them: its value opaques are plain user objects to it).

Releases and modes: 2.11.0 (backport).
Series commits:
    patches/v2.11.0/0026-dynamo-Read-a-value-type-opaque-s-attributes-in-comp.patch.
Upstream: torch 2.12.0's ``TorchScriptObjectVariable.var_getattr`` (a value
    type's unregistered attribute is read as a user object's); no fix in a
    2.11 release.

Torch 2.11 wraps a value-type opaque in a ``FakeScriptObject`` too, and its
``TorchScriptObjectVariable.var_getattr`` refuses every member not listed in
``register_opaque_type(members=...)``. So ``lambda x, c: x * c.scale`` with a
value opaque ``c`` (a plain argument, or in a subclass's flatten context)
fails on 2.11 + ``install()``: ``InternalTorchDynamoError:
UnsafeScriptObjectError: Attempted to access unregistered member on an
OpaqueObject``, where 2.10 + ``install()`` and native 2.12 - 2.14 compile it.
A value type is guarded by ``__eq__`` (the graph is traced for one value),
so its plain attributes are constants of the graph, as 2.12 treats them.
"""

from __future__ import annotations

import functools

from ..patching.registry import PatchPoint
from ._versions import ONLY_2_11


def _unregistered_value_attr(vt, name):
    """(found, value) of attribute ``name`` of the value-type opaque behind
    ``vt``, where it is no registered member and no method: the read that
    torch 2.11 refuses and 2.12 allows. ``found`` is False elsewhere."""
    import inspect

    from torch._library.fake_class_registry import FakeScriptObject
    from torch._library.opaque_object import get_member_type, is_opaque_value_type

    fake = vt.value
    if not isinstance(fake, FakeScriptObject):
        return False, None
    real = getattr(fake, "real_obj", None)
    if real is None or not is_opaque_value_type(type(real)):
        return False, None
    if get_member_type(type(real), name) is not None:
        return False, None
    try:
        value = inspect.getattr_static(real, name)
    except AttributeError:
        return False, None
    if callable(value) or hasattr(value, "__get__"):
        # methods and descriptors stay torch 2.11's (a registered member)
        return False, None
    return True, value


def _build_var_getattr(original):
    @functools.wraps(original)
    def var_getattr(self, tx, name):
        """Wraps ``TorchScriptObjectVariable.var_getattr`` (torch 2.11.0).

        Differs: a plain attribute of a value-type opaque that is no
        registered member (a config's ``scale``) is read off the real object
        and traced as a constant of the graph, as torch 2.12 reads it (the
        graph is guarded on the object's ``__eq__``), instead of refused.
        Methods, descriptors and reference types: torch's."""
        found, value = _unregistered_value_attr(self, name)
        if not found:
            return original(self, tx, name)
        from torch._dynamo.source import AttrSource
        from torch._dynamo.variables.base import VariableTracker
        from torch._dynamo.variables.constant import ConstantVariable

        if ConstantVariable.is_literal(value):
            return ConstantVariable.create(value)
        source = AttrSource(self.source, name) if self.source is not None else None
        return VariableTracker.build(tx, value, source)

    return var_getattr


POINTS = [
    PatchPoint(
        name="dynamo.TorchScriptObjectVariable.var_getattr.value_attrs",
        target="torch._dynamo.variables.script_object:TorchScriptObjectVariable.var_getattr",
        build=_build_var_getattr,
        reason="reading a value opaque's attribute in compiled code failed on 2.11 "
        "(unregistered member), as it does not on 2.10 or 2.12+",
        series=(
            "0026 torch/_dynamo/variables/script_object.py::TorchScriptObjectVariable.var_getattr",
        ),
        guarded_by=(
            "test/points/test_value_opaque_attrs.py::TestValueOpaqueAttrs::test_attr_of_value_opaque_argument",
            "test/points/test_value_opaque_attrs.py::TestValueOpaqueAttrs::test_attr_of_value_opaque_in_flatten_context",
        ),
        **ONLY_2_11,
    ),
]
