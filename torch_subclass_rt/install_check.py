"""Post-install self-check: our runtime round-trips a subclass with an opaque.

Runs inside the install transaction (a failure rolls the install back). It
exercises the installed objects through torch's own module attributes, so a
point that resolved to the wrong place fails here, not in a user's compile.
"""

from __future__ import annotations

import sys

import torch

from .patching.registry import PatchError


def _probe_classes():
    from . import _torch_compat

    base = _torch_compat.opaque_base()

    class _SelfCheckHandle(base):  # type: ignore[misc, valid-type]
        pass

    class _SelfCheckTensor(torch.Tensor):
        @staticmethod
        def __new__(cls, local, handle):
            return torch.Tensor._make_wrapper_subclass(
                cls, local.shape, dtype=local.dtype, device=local.device
            )

        def __init__(self, local, handle):
            self.local = local
            self.handle = handle

        def __tensor_flatten__(self):
            return ["local", "handle"], None

        @staticmethod
        def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
            return _SelfCheckTensor(inner["local"], inner["handle"])

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise NotImplementedError("self-check probe only")

    return base, _SelfCheckHandle, _SelfCheckTensor


_probe = None


def check_installed() -> None:
    global _probe
    from . import _torch_compat

    if _probe is None:
        _probe = _probe_classes()
    _, handle_cls, tensor_cls = _probe
    if not _torch_compat.is_registered_opaque_type(handle_cls):
        _torch_compat.register_opaque(handle_cls, typ="reference")

    su = sys.modules.get("torch._functorch._aot_autograd.subclass_utils")
    if su is None:
        raise PatchError("self-check: AOTAutograd subclass_utils is not imported")
    from torch._subclasses.fake_tensor import FakeTensorMode

    h1, h2 = handle_cls(), handle_cls()
    with FakeTensorMode() as mode:
        fake = tensor_cls(mode.from_tensor(torch.zeros(2)), h1)
    (meta,) = su.create_subclass_meta([fake])
    # runtime: a real subclass instance through the runtime unwrap/wrap
    t = tensor_cls(torch.zeros(2), h1)
    flat = su.runtime_unwrap_tensor_subclasses([t], append_symints=True, subclass_metas=[meta])
    if len(flat) != 2 or flat[1] is not h1:
        raise PatchError(f"self-check: runtime unwrap gave {flat!r}")
    meta.make_runtime_safe()
    rebuilt = meta.creation_fn([flat[0], h2], is_runtime=True)
    if type(rebuilt) is not tensor_cls or rebuilt.handle is not h2:
        raise PatchError("self-check: creation_fn did not rebuild with the runtime opaque")
