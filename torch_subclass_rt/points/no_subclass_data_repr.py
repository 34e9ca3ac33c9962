"""AOTAutograd's metadata printed without a fake subclass's data (issue 152183).

Upstream issue 152183 (open; PR 185632 closed unmerged), carried into the
backport (series patch 0021) and the native releases (native+fixes, forced);
patches/upstream/0004 is the same change for torch main.

Releases and modes: 2.10.0, 2.11.0 (backport); 2.12.0, 2.12.1, 2.13.0,
    2.14.0, 2.14.1 (native+fixes; 2.13.0 also forced).
Series commits:
    patches/v2.11.0/0021-aot_autograd-Describe-fake-wrapper-subclasses-in-met.patch.
Upstream: issue 152183 (open; PR 185632 closed unmerged).

Note [Metadata repr without subclass data]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
With a handler on torch's structured-trace log (``TORCH_TRACE`` set, as for
tlparse; a test framework's log capture), AOTAutograd writes its forward
metadata as an artifact: ``dataclass_repr(fw_metadata)`` (graph_capture.py,
graph_compile.py), which reprs every field. ``ViewAndMutationMeta`` holds
the traced tangents and ``SubclassCreationMeta`` the ``original_subclass``:
*fake* subclass instances. A wrapper subclass written without a
``__repr__`` (most are) gets ``Tensor.__repr__``, which formats its data:
on a fake with unbacked sizes that raises GuardOnDataDependentSymNode, and
the compile fails (BackendCompilerFailed) on torch 2.10.0 to 2.14.1, only
because the trace was being written. torch 2.12's lazy log record (the
backport's ``lazy_metadata_log`` points) does not help here: the artifact
is formatted whenever the log has a handler.

These two ``__repr__`` stand in for the dataclass-generated ones. A field is
printed as the dataclass prints it (``repr``), except a wrapper subclass
instance whose class has no ``__repr__`` of its own, or that holds such an
instance among its inner tensors (alone, or in a list, tuple or dict): it is
printed as ``<Type shape=... dtype=... device=...>``,
without formatting its data (trying and falling back is no option: the
attempt leaves pending unbacked symbols in the fake mode, and Inductor then
fails with PendingUnbackedSymbolNotFound). A subclass with its own
``__repr__``, and everything else, prints as on the release.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..patching.registry import PatchPoint
from ._versions import upstream_fix


def _short(t: Any) -> str:
    try:
        return (
            f"<{type(t).__qualname__} shape={tuple(t.shape)} dtype={t.dtype} "
            f"device={t.device}>"
        )
    except Exception:  # noqa: BLE001 - a description must never fail
        return f"<{type(t).__qualname__}>"


def _prints_its_data(value: Any) -> bool:
    """A wrapper subclass instance whose repr would format fake data: its
    class has no ``__repr__`` of its own (``Tensor.__repr__`` formats the
    data), or an inner tensor of it is such an instance (a nested subclass
    whose own ``__repr__`` prints its inner tensors)."""
    import torch
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not is_traceable_wrapper_subclass(value):
        return False
    if type(value).__repr__ is torch.Tensor.__repr__:
        return True
    try:
        attrs, _ctx = value.__tensor_flatten__()
    except Exception:  # noqa: BLE001 - an unflattenable instance: describe it
        return True
    return any(_prints_its_data(getattr(value, a, None)) for a in attrs)


def field_repr(value: Any) -> str:
    """``repr(value)``, except that a wrapper subclass instance without a
    ``__repr__`` of its own, alone or in a list, tuple or dict, is
    described rather than printed (never formatted: even trying leaves
    unbacked symbols in the fake mode)."""
    if _prints_its_data(value):
        return _short(value)
    if isinstance(value, (list, tuple, dict)) and _holds_one(value):
        if isinstance(value, list):
            return "[" + ", ".join(field_repr(v) for v in value) + "]"
        if isinstance(value, tuple):
            inner = ", ".join(field_repr(v) for v in value)
            return "(" + inner + ("," if len(value) == 1 else "") + ")"
        return "{" + ", ".join(f"{field_repr(k)}: {field_repr(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _holds_one(value: Any) -> bool:
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for _k, v in items:
        if _prints_its_data(v) or (isinstance(v, (list, tuple, dict)) and _holds_one(v)):
            return True
    return False


def dataclass_repr(self: Any) -> str:
    """Stands in for the dataclass-generated ``__repr__`` of AOTAutograd's
    ``ViewAndMutationMeta`` and ``SubclassCreationMeta`` (torch 2.10.0 to
    2.14.1, ``torch/_functorch/_aot_autograd/schemas.py``). Differs only
    for a wrapper subclass instance without a ``__repr__`` of its own:
    Note [Metadata repr without subclass data]."""
    fields = ", ".join(
        f"{f.name}={field_repr(getattr(self, f.name))}"
        for f in dataclasses.fields(self)
        if f.repr
    )
    return f"{type(self).__qualname__}({fields})"


POINTS = [
    PatchPoint(
        name="aot_autograd.ViewAndMutationMeta.__repr__.no_subclass_data",
        target="torch._functorch._aot_autograd.schemas:ViewAndMutationMeta.__repr__",
        build=lambda _original: dataclass_repr,
        reason="a wrapper subclass without __repr__ failed to compile while the structured "
        "trace was written: the metadata repr formatted its fake data",
        upstream_fix="issue 152183 (open; PR 185632 closed unmerged)",
        series=("0021 torch/_functorch/_aot_autograd/schemas.py::ViewAndMutationMeta",),
        guarded_by=(
            "test/points/test_no_subclass_data_repr.py::TestNoSubclassDataRepr::test_inference_with_structured_trace",
            "test/points/test_no_subclass_data_repr.py::TestNoSubclassDataRepr::test_training_with_structured_trace",
        ),
        **upstream_fix("2.10.0", "2.11.0", "2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1"),
    ),
    PatchPoint(
        name="aot_autograd.SubclassCreationMeta.__repr__.no_subclass_data",
        target="torch._functorch._aot_autograd.schemas:SubclassCreationMeta.__repr__",
        build=lambda _original: dataclass_repr,
        reason="a wrapper subclass without __repr__ failed to compile while the structured "
        "trace was written: the metadata repr formatted its fake data",
        upstream_fix="issue 152183 (open; PR 185632 closed unmerged)",
        series=(
            "0021 torch/_functorch/_aot_autograd/schemas.py::SubclassCreationMeta",
            "0021 torch/_functorch/_aot_autograd/schemas.py::_describe_without_data",
            "0021 torch/_functorch/_aot_autograd/schemas.py::_metadata_field_repr",
            "0021 torch/_functorch/_aot_autograd/schemas.py::_metadata_repr",
            "0021 torch/_functorch/_aot_autograd/schemas.py::_prints_fake_data",
        ),
        guarded_by=(
            "test/points/test_no_subclass_data_repr.py::TestNoSubclassDataRepr::test_inference_with_structured_trace",
            "test/points/test_no_subclass_data_repr.py::TestNoSubclassDataRepr::test_training_with_structured_trace",
        ),
        **upstream_fix("2.10.0", "2.11.0", "2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1"),
    ),
]
