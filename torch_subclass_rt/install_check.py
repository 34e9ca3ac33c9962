"""Post-install self-check: our runtime round-trips a subclass with an opaque.

Runs inside the install transaction (a failure rolls the install back). It
exercises the installed objects through torch's own module attributes, so a
point that resolved to the wrong place fails here, not in a user's compile.
The probe opaque type it registers is in torch's registries during the check
only (:func:`_probe_registered`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, MutableMapping
from typing import Any

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
#: what registering the probe added to torch's opaque registries, by
#: registry name: {key: value}; kept to put back for the next check
_probe_entries: dict[str, dict] = {}


def _opaque_registries() -> dict[str, Any]:
    """torch's registries of opaque types: the module-level mappings of
    ``torch._library.opaque_object`` (their number and names differ by
    release; a point may have replaced one by an overlay writing through
    to it)."""
    from . import _torch_compat

    mod = _torch_compat._opaque_object_module()
    return {
        name: value for name, value in vars(mod).items()
        if isinstance(value, (dict, MutableMapping))
    }


@contextlib.contextmanager
def _probe_registered(handle_cls: type) -> Iterator[None]:
    """The probe type registered as an opaque for the block only: torch's
    registries hold exactly what they held before it afterwards. Registering
    also names the type in torch's C++ registry, which has no way to forget
    one and refuses a second registration; so the first check registers it
    through torch and records what that added, and later checks put those
    entries back for their block."""
    from . import _torch_compat

    registries = _opaque_registries()
    if not _probe_entries:
        before = {name: set(reg.keys()) for name, reg in registries.items()}
        _torch_compat.register_opaque(handle_cls, typ="reference")
        for name, reg in registries.items():
            added = {k: reg[k] for k in set(reg.keys()) - before[name]}
            if added:
                _probe_entries[name] = added
    else:
        for name, added in _probe_entries.items():
            registries[name].update(added)
    try:
        yield
    finally:
        for name, added in _probe_entries.items():
            for key in added:
                registries[name].pop(key, None)


def check_installed() -> None:
    global _probe

    if _probe is None:
        _probe = _probe_classes()
    _, handle_cls, tensor_cls = _probe
    with _probe_registered(handle_cls):
        _check(handle_cls, tensor_cls)


def _check(handle_cls: type, tensor_cls: type) -> None:
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
