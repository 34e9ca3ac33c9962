"""Everything edited torch source may call, as ``__tsrt__.<name>``.

``patching/source_edit.py`` binds this module to the name ``__tsrt__`` in
every function it rebuilds from edited torch source (the one way edited code
reaches this package; see that module's docstring), and refuses an edit that
names something not listed here. Reading the list tells a reviewer every
entry point from torch's edited code into ours; each helper's docstring says
which edit calls it.
"""

from __future__ import annotations

from .._torch_compat import is_reference_opaque_type
from ._dynamo_opaque import (
    check_tensor_flatten_attr as _check_tensor_flatten_attr,
    check_tensor_or_opaque,
    is_opaque_attr,
    is_tensor_or_opaque,
    same_object,
)
from .fake_opaque_attrs import attach, describe_flatten_attrs, opaque_attrs_of
from .derived_submesh import is_opaque_node
from .distributed_opaques import treat_as_opaque
from .dtensor import flatten_ctx_ok
from .dynamo_opaque_inputs import mark_opaque_attr_builder
from .lazy_members import check_registered_members_exist
from .opaque_members import opaque_type_info, opaque_value_repr, set_registered_members
from .torch_2_11_base import (
    is_fake_opaque,
    record_saved_opaques,
    refuse_compiled_autograd_with_opaques,
    split_saved_opaques,
)

__all__ = [
    # fake_tensors: MetaTensorDescriber.describe_tensor, MetaConverter.meta_tensor
    "attach",
    "describe_flatten_attrs",
    "opaque_attrs_of",
    # dynamo / guards
    "_check_tensor_flatten_attr",
    "check_tensor_or_opaque",
    "is_opaque_attr",
    "is_tensor_or_opaque",
    "same_object",
    # partitioners: default_partition
    "is_opaque_node",
    # dynamo: VariableBuilder._wrap, VariableBuilder.wrap_tensor (and its DTensor branch)
    "treat_as_opaque",
    "mark_opaque_attr_builder",
    "flatten_ctx_ok",
    # parametrize, distributed (FSDP sync): is_opaque_attr above, and
    "is_reference_opaque_type",
    # torch_2_11_base (torch 2.10): partitioners, graph_compile
    "is_fake_opaque",
    "record_saved_opaques",
    "refuse_compiled_autograd_with_opaques",
    "split_saved_opaques",
    # opaque_members (torch 2.10): register_opaque_type, maybe_to_fake_obj
    "opaque_type_info",
    "opaque_value_repr",
    "set_registered_members",
    # lazy_members (torch 2.10): maybe_to_fake_obj, members read when read
    "check_registered_members_exist",
]
