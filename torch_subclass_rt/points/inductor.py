"""Inductor's FX-graph cache key for opaque graph inputs (2.11).

A reference opaque in a subclass's flatten attrs reaches Inductor as a
``FakeScriptObject`` graph input. 2.11's cache-key pickler pickles its real
object; a handle holding a process group cannot be pickled, so every compile
bypasses the FX-graph cache ("Failed to pickle cache key"), and a picklable
one (a whole DeviceMesh) is pickled on every compile for nothing.

The compiled code does not depend on a reference opaque's state: it is a
runtime input, and anything Dynamo read off it at compile time (guard_fn
values, USE_REAL members) is baked into the graph, whose code is part of the
key already. So the key names the opaque's type, as AOTAutogradCache does for
opaques in 2.12+.
"""

from __future__ import annotations

import functools

from .._torch_compat import is_reference_opaque_type
from ..patching.registry import PatchPoint
from ._versions import ONLY_BACKPORT


def _build(original):
    """build(): wraps ``torch._inductor.codecache.FxGraphCachePickler.
    _reduce_fake_script_object`` (torch 2.11.0). Differs from 2.11: a
    FakeScriptObject of a reference opaque reduces to a key naming its type
    instead of pickling the real object (module docstring).
    Note [install() is transparent without opaques]: delegation (only a
    reference opaque is keyed here; everything else goes to the original)."""
    @functools.wraps(original)
    def _reduce_fake_script_object(self, t):
        real = t.real_obj
        if real is not None and is_reference_opaque_type(type(real)):
            cls = type(real)
            # (str, (key,)) pickles as builtins.str plus one string: no
            # reference to the class, which may be local to a function.
            return (str, (f"opaque:{cls.__module__}.{cls.__qualname__}:{t.script_class_name}",))
        return original(self, t)

    return _reduce_fake_script_object


POINTS = [
    PatchPoint(
        name="inductor.FxGraphCachePickler._reduce_fake_script_object",
        target="torch._inductor.codecache:FxGraphCachePickler._reduce_fake_script_object",
        build=_build,
        reason="cache key names a reference opaque's type instead of pickling it",
        series=(
            "0005 torch/_inductor/codecache.py::FxGraphCachePickler._reduce_fake_script_object",
        ),
        guarded_by=(
            "test/test_inductor_cache_key.py::TestInductorCacheKeyWithOpaque::test_unpicklable_reference_opaque_is_cached",
        ),
        **ONLY_BACKPORT,
    ),
]
