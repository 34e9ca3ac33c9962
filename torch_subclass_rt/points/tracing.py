"""Proxy tracing of opaques: one real object, one graph input.

Series patch 0001 (``proxy_tensor``, ``FakeScriptObject.__init__``), and
``fx.wrap_key`` (torch 2.11 only: 0023).

Releases and modes: 2.10.0, 2.11.0 (backport).
Series commits:
    patches/v2.10.0/0001-aot_autograd-Opaque-reference-objects-as-inner-attrs.patch,
    patches/v2.11.0/0023-fx-functorch-A-real-opaque-a-traced-function-returns.patch.
Upstream: none (not an upstream fix).

Proxy tracing of opaques (2.10 / 2.11): one object, one graph input.

The code of the points ``fx.set_proxy_slot``, ``fx.get_proxy_slot``,
``fx.wrap_key`` and ``library.FakeScriptObject.__init__``.

While AOTAutograd traces, the same real opaque can be wrapped in several
``FakeScriptObject``s (one per subclass input that shares a mesh, a fresh one
each time ``unwrap_tensor_subclasses`` fakeifies an output). 2.11 tracks proxies
per wrapper and deep-copies the real object into every wrapper, so a shared
mesh turns into several graph inputs (an extra saved ``primals_N``) and the
wrappers lose the identity of the caller's object. Torch 2.12 keys proxies by
the real object and stops deep-copying registered opaques; these points port
that, so graph dumps match 2.13 byte for byte.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from .._torch_compat import is_registered_opaque_type
from ..patching.registry import PatchPoint
from ._versions import ONLY_2_11, ONLY_BACKPORT

_NO_REAL_OBJ = object()
#: tracer attribute holding id(real opaque) -> first proxy registered for it.
#: Lives as long as the tracer (one trace), as do the real objects it names.
_SIDE_MAP = "_tsrt_opaque_real_obj_proxy"


def _real_obj(obj: Any) -> Any:
    from torch._library.fake_class_registry import FakeScriptObject

    if isinstance(obj, FakeScriptObject):
        real = object.__getattribute__(obj, "__dict__").get("real_obj", _NO_REAL_OBJ)
        if real is not None and real is not _NO_REAL_OBJ and is_registered_opaque_type(type(real)):
            return real
    return _NO_REAL_OBJ


def real_obj_proxies(tracer: Any) -> dict[int, Any]:
    """id(real opaque) -> its first proxy in this trace (the side map)."""
    return tracer.__dict__.setdefault(_SIDE_MAP, {})


def _wrap_set_proxy_slot(original):
    """build(): wraps ``torch.fx.experimental.proxy_tensor.set_proxy_slot``
    (torch 2.11.0). Differs from 2.11: a FakeScriptObject of a registered
    opaque whose real object already has a proxy in this trace is given
    that proxy, as 2.12 keys opaque proxies by the real object.
    Note [install() is transparent without opaques]: delegation (the side
    map only records FakeScriptObjects of registered opaques)."""
    @functools.wraps(original)
    def set_proxy_slot(obj, tracer, proxy):
        real = _real_obj(obj)
        if real is not _NO_REAL_OBJ:
            # First proxy wins (primals are registered before tangents), as
            # for symints: later wrappers of the same object reuse it, so the
            # forward never depends on a tangent placeholder.
            proxy = real_obj_proxies(tracer).setdefault(id(real), proxy)
        return original(obj, tracer, proxy)

    return set_proxy_slot


def _wrap_get_proxy_slot(original):
    """build(): wraps ``torch.fx.experimental.proxy_tensor.get_proxy_slot``
    (torch 2.11.0). Differs from 2.11: a miss for a FakeScriptObject of a
    registered opaque is answered with the proxy of its real object, if the
    trace has one (2.12's keying by real object).
    Note [install() is transparent without opaques]: delegation (a miss is
    retried with the caller's default, so torch's own answer or error comes
    back)."""
    from torch.fx.experimental.proxy_tensor import _NoDefault

    missing = object()

    @functools.wraps(original)
    def get_proxy_slot(obj, tracer, default=_NoDefault(), transform=lambda x: x):
        value = original(obj, tracer, missing, transform)
        if value is not missing:
            return value
        real = _real_obj(obj)
        if real is not _NO_REAL_OBJ:
            proxy = tracer.__dict__.get(_SIDE_MAP, {}).get(id(real))
            if proxy is not None:
                return transform(proxy)
        return original(obj, tracer, default, transform)

    return get_proxy_slot


def _wrap_wrap_key(original):
    """build(): wraps ``torch.fx.experimental.proxy_tensor.wrap_key``
    (torch 2.11.0). Differs from 2.11 as 2.13 does: a real (not fake)
    reference-type opaque the traced function returns, such as the
    DeviceMesh of a DTensor output while AOTAutograd traces over a graph
    Dynamo compiled, is answered with its tracked proxy (a graph input)
    instead of being baked in as a ``get_attr`` constant without
    ``meta["val"]``; 2.11 maps only tensors, ScriptObjects and fakes.
    Note [install() is transparent without opaques]: delegation (only
    outputs that are registered reference opaques are looked up)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_slot
    from torch.utils import _pytree as pytree

    from .._torch_compat import is_reference_opaque_type

    @functools.wraps(original)
    def wrap_key(f, tensors, tracer, pre_dispatch):
        wrapped = original(f, tensors, tracer, pre_dispatch)

        def is_real_reference_opaque(x):
            return is_reference_opaque_type(type(x))

        @functools.wraps(wrapped)
        def with_opaque_outputs(*proxies, **kwargs):
            out = wrapped(*proxies, **kwargs)
            return pytree.tree_map_only(
                is_real_reference_opaque, lambda t: get_proxy_slot(t, tracer, t), out
            )

        return with_opaque_outputs

    return wrap_key


def _fake_script_object_init(original):
    """Replaces ``FakeScriptObject.__init__`` (torch 2.10.0, 2.11.0).

    Differs from them: a registered opaque is kept as ``real_obj`` instead
    of being deep-copied (a DeviceMesh deep copy is costly, and the copy
    breaks identity with the caller's object, which dedup and guards rely
    on). TorchScript objects are still deep-copied, as in 2.11 and 2.13, and
    a failed copy is handled as the release being patched handles it (2.10
    falls back to the object itself on a RuntimeError only; 2.11 on a
    TypeError too).
    Note [install() is transparent without opaques]: identical for every object
    that is not a registered opaque (the release's deep copy and warning).
    """
    from torch.utils._python_dispatch import _disable_current_modes

    from .._torch_compat import version_tuple

    log = logging.getLogger("torch._library.fake_class_registry")
    copy_errors = (RuntimeError,) if version_tuple()[:2] < (2, 11) else (RuntimeError, TypeError)

    def __init__(self, wrapped_obj, script_class_name, x):
        object.__setattr__(self, "wrapped_obj", wrapped_obj)
        object.__setattr__(self, "script_class_name", script_class_name)
        real_obj = x
        if not is_registered_opaque_type(type(x)):
            try:
                import copy

                with _disable_current_modes():
                    real_obj = copy.deepcopy(x)
            except copy_errors as e:
                log.warning(
                    "Unable to deepcopy the custom object %s due to %s. "
                    "Defaulting to the user given object. This might be "
                    "dangerous as side effects may be directly applied "
                    "to the object.",
                    script_class_name,
                    e,
                )
        object.__setattr__(self, "real_obj", real_obj)

    __init__.__qualname__ = original.__qualname__
    return __init__


POINTS = [
    PatchPoint(
        name="library.FakeScriptObject.__init__",
        target="torch._library.fake_class_registry:FakeScriptObject.__init__",
        build=_fake_script_object_init,
        reason="keep the caller's opaque as real_obj (no deepcopy), as 2.12 does",
        series=("0001 torch/_library/fake_class_registry.py::FakeScriptObject.__init__",),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_shared_opaque_backward_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="fx.set_proxy_slot",
        target="torch.fx.experimental.proxy_tensor:set_proxy_slot",
        build=_wrap_set_proxy_slot,
        reason="wrappers of one real opaque share one proxy (one graph input)",
        series=(
            "0001 torch/fx/experimental/proxy_tensor.py::set_proxy_slot",
            "0001 torch/fx/experimental/proxy_tensor.py::_registered_opaque_real_obj",
        ),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_shared_opaque_backward_cpu",
            "test/runtime/test_opaque_subclass_parity.py::TestOpaqueSubclassParityCPU::test_tangent_primal_proxy_collision_for_opaque_inner_attr_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="fx.get_proxy_slot",
        target="torch.fx.experimental.proxy_tensor:get_proxy_slot",
        build=_wrap_get_proxy_slot,
        reason="find the proxy of a fresh wrapper of an already-traced opaque",
        series=(
            "0001 torch/fx/experimental/proxy_tensor.py::get_proxy_slot",
            "0001 torch/fx/experimental/proxy_tensor.py::_registered_opaque_real_obj",
        ),
        rebinds=("torch._higher_order_ops.executorch_call_delegate", "torch.export._trace"),
        # the tracer's map of real objects to proxies that it reads is
        # fx.set_proxy_slot's (Note [State between points])
        requires=("fx.set_proxy_slot",),
        guarded_by=(
            "test/points/test_point_guards.py::TestPointGuards::test_dispatch_attached_handle_is_the_handle",
            "test/runtime/test_opaque_subclass_parity.py::TestOpaqueSubclassParityCPU::test_tangent_primal_proxy_collision_for_opaque_inner_attr_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="fx.wrap_key",
        target="torch.fx.experimental.proxy_tensor:wrap_key",
        build=_wrap_wrap_key,
        reason="a traced function's real opaque output is its graph input, not a constant (2.13)",
        series=(
            "0023 torch/fx/experimental/proxy_tensor.py::wrap_key",
            "0023 torch/fx/experimental/proxy_tensor.py::_is_real_opaque_reference",
        ),
        guarded_by=(
            "test/distributed/test_dtensor_opaque_mesh.py::TestDTensorOpaqueMeshCPU::test_aot_over_dynamo_mesh_output_cpu",
        ),
        **ONLY_2_11,
    ),
]
