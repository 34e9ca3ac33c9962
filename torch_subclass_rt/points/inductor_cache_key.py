"""Opaque graph inputs in Inductor's FX-graph cache key and benchmark harness.

Series patch 0005 ("Opaque graph inputs in the FX graph cache key").

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

Releases and modes: 2.10.0, 2.11.0 (backport).
Series commits:
    patches/v2.10.0/0005-inductor-Opaque-graph-inputs-in-the-FX-graph-cache-k.patch.
Upstream: none (not an upstream fix).
"""

from __future__ import annotations

import functools
import pickle

from .._torch_compat import is_reference_opaque_type
from ..patching.registry import PatchPoint
from ..patching.source_edit import Edit, edited_function
from ._versions import ONLY_2_10, ONLY_2_11, ONLY_BACKPORT


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


def _build_pickler_init_2_10(original):
    """Wraps ``torch._inductor.codecache.FxGraphCachePickler.__init__``
    (torch 2.10.0). Differs from 2.10, as 2.11 plus the point above: a
    FakeScriptObject gets a dispatch-table entry; a reference opaque's
    reduces to a key naming its type (module docstring), any other reduces
    as the pickler would without the entry (2.10 has none: it pickles the
    object's state, which for a handle holding a process group fails and
    bypasses the cache). Note [install() is transparent without opaques]:
    identical for everything but a reference opaque's fake."""
    from torch._library.fake_class_registry import FakeScriptObject

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.dispatch_table[FakeScriptObject] = functools.partial(_reduce_fake_2_10, self)

    return __init__


def _reduce_fake_2_10(pickler, t):
    real = object.__getattribute__(t, "real_obj")
    if real is not None and is_reference_opaque_type(type(real)):
        cls = type(real)
        return (str, (f"opaque:{cls.__module__}.{cls.__qualname__}:{t.script_class_name}",))
    # the pickler's default protocol (FxGraphCachePickler names none)
    return t.__reduce_ex__(pickle.DEFAULT_PROTOCOL)


def _build_benchmark_compiled_module(original):
    """``PythonWrapperCodegen.benchmark_compiled_module`` (torch 2.11.0) with
    an opaque graph input (a subclass's opaque inner attr) written as
    ``None`` into the benchmark harness's ``get_args()``, as 2.12+ writes
    every such input, instead of its real object pickled into the output
    code (a mesh holding a process group cannot be pickled; upstream's
    test_benchmark_harness_no_pickle_for_opaque_inputs).
    Note [install() is transparent without opaques]: identical (torch's own
    source; a TorchScript object input takes 2.11's branch unchanged).
    """
    return edited_function(
        original,
        [
            Edit(
                """
                if isinstance(value, ir.TorchBindObject):
                    if len(V.graph.torchbind_constants) == 0:
                """,
                """
                if isinstance(value, ir.TorchBindObject) and __tsrt__.is_opaque_attr(
                    value.get_real_obj()
                ):
                    output.writeline(f"{name} = None")
                elif isinstance(value, ir.TorchBindObject):
                    if len(V.graph.torchbind_constants) == 0:
                """,
            ),
        ],
    )


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
            "test/points/test_inductor_cache_key.py::TestInductorCacheKeyWithOpaque::test_unpicklable_reference_opaque_is_cached",
        ),
        **ONLY_2_11,
    ),
    PatchPoint(
        name="inductor.FxGraphCachePickler.__init__",
        target="torch._inductor.codecache:FxGraphCachePickler.__init__",
        build=_build_pickler_init_2_10,
        reason="cache key pickled a reference opaque (a process group: cache bypassed)",
        # the 2.10 form of inductor.FxGraphCachePickler._reduce_fake_script_object
        # (2.10 has no such method: the series adds it with its table entry)
        series=(
            "0005 torch/_inductor/codecache.py::FxGraphCachePickler.__init__",
            "0005 torch/_inductor/codecache.py::FxGraphCachePickler._reduce_fake_script_object",
        ),
        guarded_by=(
            "test/points/test_inductor_cache_key.py::TestInductorCacheKeyWithOpaque::test_unpicklable_reference_opaque_is_cached",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="inductor.PythonWrapperCodegen.benchmark_compiled_module",
        target="torch._inductor.codegen.wrapper:PythonWrapperCodegen.benchmark_compiled_module",
        build=_build_benchmark_compiled_module,
        reason="benchmark harness: an opaque graph input is None, not its object pickled",
        series=(
            "0005 torch/_inductor/codegen/wrapper.py::PythonWrapperCodegen.benchmark_compiled_module",
        ),
        guarded_by=(
            "test/runtime/test_opaque_subclass_parity.py::TestUpstreamOpaqueObjV2CPU"
            "::test_benchmark_harness_no_pickle_for_opaque_inputs_cpu",
        ),
        **ONLY_BACKPORT,
    ),
]
