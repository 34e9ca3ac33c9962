"""``torch.distributed``: its helpers that flatten subclasses, and DTensor.

``get_untyped_storages`` and FSDP's ``_sync_module_params_and_buffers``
(torch 2.10 / 2.11) both read every attr of ``__tensor_flatten__`` as a tensor. Torch 2.12 skips
opaque attrs: an opaque has no storage to count and nothing to broadcast (a
reference opaque such as a mesh handle is per-rank state, not data).

``DTensor.__tensor_flatten__`` & co. (opt-in group "dtensor", torch 2.11):
the mesh as an opaque inner attr, as 2.13 has it; the code and the reasons
are in ``_dtensor``.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .._torch_compat import is_opaque_attr
from ..patching.registry import PatchPoint
from ..patching.source_edit import Edit, edited_function
from ._versions import ONLY_2_11, ONLY_BACKPORT
from . import _dtensor

def _build_get_untyped_storages(original):
    """Replaces ``torch.distributed._tools.common_utils.get_untyped_storages``
    (torch 2.11.0).

    Differs from 2.11: opaque attrs of a subclass are skipped silently (2.11
    warned "Expected a tensor ..." for each, and mem_tracker / sac_estimator
    call this per tensor). Unlike 2.12, any *other* non-tensor attr still
    gets 2.11's warning rather than 2.12's AssertionError: the backport adds
    opaque support and leaves the rest of 2.11's behaviour alone.
    Note [install() is transparent without opaques]: identical (2.11's loop; without
    opaques every attr is pushed, as in 2.11).
    """

    @functools.wraps(original)
    def get_untyped_storages(t: torch.Tensor) -> set[torch.UntypedStorage]:
        unflattened_tensors = [t]
        flattened_tensor_storages = set()
        while len(unflattened_tensors) > 0:
            obj = unflattened_tensors.pop()
            if is_traceable_wrapper_subclass(obj):
                attrs, _ = obj.__tensor_flatten__()  # type: ignore[attr-defined]
                for attr in attrs:
                    value = getattr(obj, attr)
                    if not is_opaque_attr(value):
                        unflattened_tensors.append(value)
            else:
                if not hasattr(obj, "untyped_storage"):
                    warnings.warn(
                        f"Expected a tensor or a traceable wrapper-subclass of tensor, but got {type(obj)}",
                        category=UserWarning,
                        stacklevel=2,
                    )
                else:
                    flattened_tensor_storages.add(obj.untyped_storage())
        return flattened_tensor_storages

    return get_untyped_storages


def _build_sync_module_params_and_buffers(original):
    """``fsdp._init_utils._sync_module_params_and_buffers`` (torch 2.11.0)
    with its two "inner attrs of a subclass" list comprehensions filtered to
    drop opaques, as 2.12 does; otherwise an opaque reaches
    ``_check_module_states_for_sync_module_states`` (reads ``.device``) and
    the broadcast. The edited code calls our helper as ``__tsrt__.is_opaque_attr``
    (patching/source_edit.py).
    Note [install() is transparent without opaques]: identical (torch's own source; the
    filters drop nothing without opaques).
    """
    return edited_function(
        original,
        [
            Edit(
                "inner_buffers = [getattr(detached_buffer, attr) for attr in attrs]",
                "inner_buffers = [getattr(detached_buffer, attr) for attr in attrs]\n"
                "inner_buffers = [v for v in inner_buffers if not __tsrt__.is_opaque_attr(v)]",
            ),
            Edit(
                "inner_params = [getattr(detached_param, attr) for attr in attrs]",
                "inner_params = [getattr(detached_param, attr) for attr in attrs]\n"
                "inner_params = [v for v in inner_params if not __tsrt__.is_opaque_attr(v)]",
            ),
        ],
    )


POINTS = [
    PatchPoint(
        name="distributed.get_untyped_storages",
        target="torch.distributed._tools.common_utils:get_untyped_storages",
        build=_build_get_untyped_storages,
        reason="opaque attrs have no storage; 2.11 warned for each",
        rebinds=(
            "torch.distributed._tools.mem_tracker",
            "torch.distributed._tools.sac_estimator",
        ),
        series=("0004 torch/distributed/_tools/common_utils.py::get_untyped_storages",),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_get_untyped_storages_with_opaque_attrs_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="distributed.fsdp_sync_module_params_and_buffers",
        target="torch.distributed.fsdp._init_utils:_sync_module_params_and_buffers",
        series=("0004 torch/distributed/fsdp/_init_utils.py::_sync_module_params_and_buffers",),
        build=_build_sync_module_params_and_buffers,
        reason="FSDP sync_module_states: do not broadcast opaque attrs",
        guarded_by=(
            "test/points/test_point_guards.py::TestPointGuards::test_fsdp_sync_module_states_skips_opaque_attrs",
            # the same case as the series' in-tree test (0009)
            "test/runtime/test_opaque_subclass_parity.py::TestOpaqueSubclassParityCPU"
            "::test_fsdp_sync_module_states_skips_opaque_attrs_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="distributed.DTensor.__tensor_flatten__",
        target="torch.distributed.tensor._api:DTensor.__tensor_flatten__",
        series=("0014 torch/distributed/tensor/_api.py::DTensor.__tensor_flatten__",),
        build=lambda _original: _dtensor._tensor_flatten,
        reason="DTensor's mesh is an inner attr (an opaque graph input), as in torch 2.13",
        group=_dtensor.GROUP,
        guarded_by=(_dtensor._GUARD + "test_equal_meshes_one_compile_cpu",),
        **ONLY_2_11,
    ),
    PatchPoint(
        name="distributed.DTensor.__tensor_unflatten__",
        target="torch.distributed.tensor._api:DTensor.__tensor_unflatten__",
        series=("0014 torch/distributed/tensor/_api.py::DTensor.__tensor_unflatten__",),
        build=lambda _original: staticmethod(_dtensor._tensor_unflatten),
        reason="DTensor's spec is rebuilt around the mesh passed at run time, as in torch 2.13",
        group=_dtensor.GROUP,
        guarded_by=(_dtensor._GUARD + "test_dtensor_input_fwd_bwd_aot_eager_cpu",),
        **ONLY_2_11,
    ),
    PatchPoint(
        name="distributed.DTensor.__coerce_same_metadata_as_tangent__",
        target="torch.distributed.tensor._api:DTensor.__coerce_same_metadata_as_tangent__",
        series=("0014 torch/distributed/tensor/_api.py::DTensor.__coerce_same_metadata_as_tangent__",),
        build=lambda _original: _dtensor._coerce_same_metadata_as_tangent,
        reason="a tangent's placements are read from the new flatten context",
        group=_dtensor.GROUP,
        guarded_by=(_dtensor._GUARD + "test_dtensor_input_fwd_bwd_aot_eager_cpu",),
        **ONLY_2_11,
    ),
]
