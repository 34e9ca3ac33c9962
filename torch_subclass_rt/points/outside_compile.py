"""Opaque inner attrs outside the compiled region: export, parametrize, FSDP.

Series patch 0004 ("[export][parametrize][fsdp] Opaque inner attrs outside
...").

Non-strict export builds a symbolic context for every input tensor with
``non_strict_utils._create_symbolic_context_for_tensor``, which recurses into
every attr named by ``__tensor_flatten__`` and reads ``.shape`` off it: an
opaque attr fails with ``'Counter' object has no attribute 'shape'``. Torch
2.12 skips opaque attrs, so the subclass's ``inner_contexts`` holds entries for
its tensor attrs only. Strict export goes through Dynamo and needs no point.

``get_untyped_storages`` and FSDP's ``_sync_module_params_and_buffers``
both read every attr of ``__tensor_flatten__`` as a tensor. Torch 2.12 skips
opaque attrs: an opaque has no storage to count and nothing to broadcast (a
reference opaque such as a mesh handle is per-rank state, not data).

Releases and modes: 2.10.0, 2.11.0 (backport).
Series commits:
    patches/v2.10.0/0004-export-parametrize-fsdp-Opaque-inner-attrs-outside-t.patch.
Upstream: none (not an upstream fix).

``unwrap_tensor_subclass_parameters`` with opaque attrs (torch 2.10 / 2.11).

The code of the points ``aot_autograd.UnwrapTensorSubclass.*`` and
``nn.ParametrizationList.*``.

``UnwrapTensorSubclass`` (the parametrization that replaces a subclass
parameter by its inner tensors) recurses into every attr of
``__tensor_flatten__`` and calls ``__tensor_flatten__`` on an opaque. Torch
2.12 records an ``OpaqueMeta`` for a reference-type opaque attr, passes the
object itself through the flat list, and ``ParametrizationList`` stores it
as a plain attribute ``original{i}`` (not a parameter or buffer, so it is in
neither ``parameters()`` nor ``state_dict()``). This module ports both.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .._torch_compat import is_opaque_attr, is_reference_opaque_type
from ..patching.registry import PatchPoint
from ..patching.source_edit import Edit, edited_function
from ..runtime import errors
from ..runtime.meta import OpaqueMeta
from ._versions import ONLY_BACKPORT



# --- UnwrapTensorSubclass ---------------------------------------------------


def _build_forward(original):
    """Replaces ``subclass_parametrization.UnwrapTensorSubclass.forward``
    (torch 2.11.0).

    Differs from 2.11: an ``OpaqueMeta`` attr takes its object from the next
    flat slot as is, instead of recursing into it (torch 2.12 behaviour).
    Note [install() is transparent without opaques]: identical without an
    ``OpaqueMeta`` (2.11's recursion and rebuild).
    """

    @functools.wraps(original)
    def forward(self, *tensors):  # type: ignore[no-untyped-def]
        todo: list[Any] = list(tensors)

        def _unwrap_tensor_subclasses(subclass_meta, tensors, offset):  # type: ignore[no-untyped-def]
            if subclass_meta is None:
                return tensors[offset], offset + 1
            inner_tensors = {}
            for attr, meta in subclass_meta.attrs.items():
                if isinstance(meta, OpaqueMeta):
                    inner_tensors[attr] = tensors[offset]
                    offset += 1
                else:
                    built_tensor, offset = _unwrap_tensor_subclasses(
                        meta, tensors, offset
                    )
                    inner_tensors[attr] = built_tensor
            rebuilt = subclass_meta.class_type.__tensor_unflatten__(
                inner_tensors,
                subclass_meta.metadata,
                subclass_meta.outer_size,
                subclass_meta.outer_stride,
            )
            return rebuilt, offset

        return _unwrap_tensor_subclasses(self.subclass_meta, todo, 0)[0]

    return forward


def _build_right_inverse(original):
    """Replaces ``subclass_parametrization.UnwrapTensorSubclass.right_inverse``
    (torch 2.11.0).

    Differs from 2.11 (as torch 2.12): a reference-type opaque attr gets an
    ``OpaqueMeta`` and the object itself is appended to the flat list;
    a value-type opaque raises ``ValueError``; any other non-tensor attr
    raises ``AssertionError`` (2.11 failed on it with an AttributeError).
    Note [install() is transparent without opaques]: identical for tensor attrs
    (2.11's metadata and flat list); a non-tensor, non-opaque attr is the
    Note's named exception.
    """
    # 2.11's own dataclass, so consumers see the type they expect.
    subclass_creation_meta = original.__globals__["SubclassCreationMeta"]

    @functools.wraps(original)
    def right_inverse(self, tensor: torch.Tensor) -> list[Any]:
        if type(tensor) is torch.Tensor:
            raise AssertionError("tensor must be a subclass, not torch.Tensor")
        plain_tensors: list[Any] = []

        def _create_subclass_meta(tensor, idx, plain_tensor_container):  # type: ignore[no-untyped-def]
            if type(tensor) is torch.Tensor:
                plain_tensor_container.append(tensor)
                return None, idx + 1
            inner_tensors_attrnames, metadata = tensor.__tensor_flatten__()  # type: ignore[attr-defined]
            new_idx = idx
            attr_to_meta: dict[str, Any] = {}
            for attr in inner_tensors_attrnames:
                val = getattr(tensor, attr)
                if is_opaque_attr(val):
                    if not is_reference_opaque_type(type(val)):
                        raise errors.not_an_inner_attr_error(
                            tensor, attr, val, value_exc_type=ValueError
                        )
                    attr_to_meta[attr] = OpaqueMeta()
                    plain_tensor_container.append(val)
                    new_idx += 1
                elif isinstance(val, torch.Tensor):
                    subclass_meta, new_idx = _create_subclass_meta(
                        val, new_idx, plain_tensor_container
                    )
                    attr_to_meta[attr] = subclass_meta
                else:
                    raise AssertionError(
                        f"expected Tensor or OpaqueBase, got {type(val)}"
                    )
            return (
                subclass_creation_meta(
                    start_idx=idx,
                    num_tensors=new_idx - idx,
                    class_type=type(tensor),
                    attrs=attr_to_meta,
                    metadata=metadata,
                    outer_size=tensor.size(),
                    outer_stride=tensor.stride(),
                ),
                new_idx,
            )

        self.subclass_meta = _create_subclass_meta(tensor, 0, plain_tensors)[0]
        return plain_tensors

    return right_inverse


# --- ParametrizationList ----------------------------------------------------
# Both methods are long and only their per-element type checks change, so
# they are source edits of 2.11's text; they call our helpers as
# __tsrt__.<name> (patching/source_edit.py).


def _build_parametrization_list_init(original):
    """``ParametrizationList.__init__`` (torch 2.11.0) with one edit, as 2.12:
    an element of ``right_inverse``'s sequence that is a reference-type opaque
    is stored as a plain attribute ``original{i}``; a value-type opaque raises
    ``ValueError``. The zero-argument ``super()`` keeps working (source_edit
    re-creates the ``__class__`` cell).
    Note [install() is transparent without opaques]: identical (torch's own
    source; the inserted branch only takes opaques).
    """
    return edited_function(
        original,
        [
            Edit(
                """
                for i, originali in enumerate(new):
                    if not isinstance(originali, Tensor):
                """,
                """
                for i, originali in enumerate(new):
                    if __tsrt__.is_opaque_attr(originali):
                        if not __tsrt__.is_reference_opaque_type(type(originali)):
                            raise ValueError(
                                f"'right_inverse' must return a Tensor or a reference-type "
                                f"opaque. Got element {i} of the sequence with type "
                                f"{type(originali).__name__}."
                            )
                        # Not a parameter or buffer: no grad, not in state_dict.
                        setattr(self, f"original{i}", originali)
                        continue
                    if not isinstance(originali, Tensor):
                """,
            )
        ],
    )


def _build_parametrization_list_right_inverse(original):
    """``ParametrizationList.right_inverse`` (torch 2.11.0) with one edit, as
    2.12: a reference-type opaque in the returned sequence replaces the plain
    attribute ``original{i}`` (no dtype check, no ``set_``).
    Note [install() is transparent without opaques]: identical (torch's own
    source; the inserted branch only takes opaques).
    """
    return edited_function(
        original,
        [
            Edit(
                """
                for i, tensor in enumerate(value):
                    original_i = getattr(self, f"original{i}")
                    if not isinstance(tensor, Tensor):
                """,
                """
                for i, tensor in enumerate(value):
                    original_i = getattr(self, f"original{i}")
                    if not isinstance(tensor, Tensor):
                        if __tsrt__.is_opaque_attr(tensor) and __tsrt__.is_reference_opaque_type(
                            type(tensor)
                        ):
                            setattr(self, f"original{i}", tensor)
                            continue
                """,
            ),
            # 2.12's wording of the error, which now also admits opaques.
            Edit(
                """
                f"`right_inverse` must return a sequence of tensors. "
                f"Got element {i} of type {type(tensor).__name__}"
                """,
                """
                f"'right_inverse' must return a sequence of tensors "
                f"or reference-type opaques. Got element {i} of type "
                f"{type(tensor).__name__}."
                """,
            ),
        ],
    )


class _OpaqueAttr:
    """Stands in for the context of an opaque attr until the parent strips it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<opaque attr: no symbolic context>"


_OPAQUE_ATTR = _OpaqueAttr()


def _build_create_symbolic_context_for_tensor(original):
    """Wraps ``_export.non_strict_utils._create_symbolic_context_for_tensor``
    (torch 2.11.0): sentinel-then-strip, no copy of its code.

    The function recurses through its module global, which is this wrapper
    once installed. So the recursive call for an opaque attr lands here and
    answers a sentinel instead of reading ``.shape``; when the parent's
    context comes back, the sentinel entries are removed from its
    ``inner_contexts`` (a plain dict), leaving exactly what 2.12+ builds.
    Everything else is the original code, untouched.
    Note [install() is transparent without opaques]: delegation (without opaques no
    sentinel is made or stripped; the original's result is returned as is).
    """

    @functools.wraps(original)
    def _create_symbolic_context_for_tensor(t, source, t_constraints, sources, mode):
        if is_opaque_attr(t):
            return _OPAQUE_ATTR
        context = original(t, source, t_constraints, sources, mode)
        inner = getattr(context, "inner_contexts", None)
        if inner:
            for attr in [a for a, c in inner.items() if c is _OPAQUE_ATTR]:
                del inner[attr]
        return context

    return _create_symbolic_context_for_tensor


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
        name="aot_autograd.UnwrapTensorSubclass.forward",
        target="torch._functorch._aot_autograd.subclass_parametrization"
        ":UnwrapTensorSubclass.forward",
        series=(
            "0004 torch/_functorch/_aot_autograd/subclass_parametrization.py"
            "::UnwrapTensorSubclass.forward",
        ),
        build=_build_forward,
        reason="rebuild the subclass with its opaque attrs from the flat originals",
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_subclass_parametrization_with_opaque_attrs_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="aot_autograd.UnwrapTensorSubclass.right_inverse",
        target="torch._functorch._aot_autograd.subclass_parametrization"
        ":UnwrapTensorSubclass.right_inverse",
        series=(
            "0004 torch/_functorch/_aot_autograd/subclass_parametrization.py"
            "::UnwrapTensorSubclass.right_inverse",
        ),
        build=_build_right_inverse,
        reason="OpaqueMeta for opaque attrs; the object is one flat original",
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_subclass_parametrization_with_opaque_attrs_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="export.create_symbolic_context_for_tensor",
        target="torch._export.non_strict_utils:_create_symbolic_context_for_tensor",
        series=("0004 torch/_export/non_strict_utils.py::_create_symbolic_context_for_tensor",),
        build=_build_create_symbolic_context_for_tensor,
        reason="non-strict export: no symbolic context for opaque attrs of a "
        "subclass input (2.11 reads .shape off them)",
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_export_non_strict_with_opaque_attrs_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="nn.ParametrizationList.__init__",
        target="torch.nn.utils.parametrize:ParametrizationList.__init__",
        series=("0004 torch/nn/utils/parametrize.py::ParametrizationList.__init__",),
        build=_build_parametrization_list_init,
        reason="store an opaque original as a plain attribute, not a parameter",
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_subclass_parametrization_with_opaque_attrs_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="nn.ParametrizationList.right_inverse",
        target="torch.nn.utils.parametrize:ParametrizationList.right_inverse",
        series=("0004 torch/nn/utils/parametrize.py::ParametrizationList.right_inverse",),
        build=_build_parametrization_list_right_inverse,
        reason="assigning a subclass re-stores its opaque original as an attribute",
        guarded_by=(
            "test/points/test_point_guards.py::TestPointGuards::test_parametrized_subclass_assigned_again",
        ),
        **ONLY_BACKPORT,
    ),
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
]
