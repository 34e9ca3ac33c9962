"""Called from bytecode Dynamo generates while a fix point is installed
(``points/fixes.py``). Kept importable on its own: compiled code that
imported it keeps working after ``uninstall()``."""

from __future__ import annotations

from typing import Any


def unwrap_value_opaque(obj: Any) -> Any:
    """The real object behind a value-type opaque's FakeScriptObject; any
    other object unchanged (reference opaques stay as the graph returned them).

    Python code after a compiled graph (a side effect storing the object, a
    returned value) must see the object the user created, as eager does.
    """
    from torch._library.fake_class_registry import FakeScriptObject

    from .._torch_compat import is_value_opaque_type

    if isinstance(obj, FakeScriptObject):
        real = object.__getattribute__(obj, "real_obj")
        if real is not None and is_value_opaque_type(type(real)):
            return real
    return obj
