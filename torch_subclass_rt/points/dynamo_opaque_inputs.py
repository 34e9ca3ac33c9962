"""Dynamo traces a subclass input whose flatten attrs include opaques.

Series patch 0003 ("Trace subclass inputs with opaque inner attrs"; and
0008's share of ``PyCodegen.__call__``).

torch 2.11's Dynamo assumes every ``__tensor_flatten__`` attr is a tensor
when it picks dynamic dims for an input (``_automatic_dynamic``), marks dims
dynamic (``mark_dynamic``), reads an attr off an intermediate subclass
(``y.mesh``), wraps an op output that is a FakeScriptObject and returns a
graph output. Reference opaques are already
lifted to graph inputs on 2.11 (``wrap_tensor`` builds every attr), so only
these tensor-only assumptions need porting from torch 2.12 (PR 176457).
Each of those points is a small source edit of the 2.11 function, except
the 11-line ``_apply_func_to_inner_tensors_of_same_dim``, which is
replaced. The checks the edited sources call are in ``_dynamo_opaque``.

Releases and modes: 2.10.0, 2.11.0 (backport).
Series commits:
    patches/v2.10.0/0003-dynamo-Trace-subclass-inputs-with-opaque-inner-attrs.patch,
    patches/v2.10.0/0008-dynamo-Guard-state-pickling-and-returned-value-opaqu.patch,
    patches/v2.10.0/0012-distributed-dynamo-DeviceMesh-and-ProcessGroup-as-re.patch,
    patches/v2.11.0/0014-distributed-dynamo-DTensor-flattens-with-device_mesh.patch.
Upstream: none (not an upstream fix).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .._torch_compat import is_opaque_attr
from ..patching import point_state
from ..patching.registry import PatchPoint
from ..patching.source_edit import Edit, edited_function
from ._versions import ONLY_BACKPORT, per_release


def _build_automatic_dynamic(original):
    """``torch._dynamo.variables.builder._automatic_dynamic`` (torch 2.11.0)
    with one edit. Differs from 2.11, as 2.12: no inner symbolic context for
    opaque attrs; an attr that is neither a tensor nor an opaque raises the
    runtime's TypeError here. Note [install() is transparent without
    opaques]: identical (torch's own source; without opaques the inserted
    lines skip nothing; a non-tensor, non-opaque attr is the Note's named
    exception)."""
    # 2.12 creates inner symbolic contexts for tensor attrs only; opaque attrs
    # have none (meta_tensor and produce_guards_verbose skip them too). This
    # is the first place Dynamo looks at the attrs, so an attr that is neither
    # a tensor nor an opaque is reported here, naming the subclass and attr.
    return edited_function(
        original,
        [
            Edit(
                """
                for attr in attrs:
                    inner_tensor = getattr(e, attr)
                """,
                """
                for attr in attrs:
                    inner_tensor = getattr(e, attr)
                    __tsrt__.check_tensor_or_opaque(e, attr, inner_tensor)
                    if __tsrt__.is_opaque_attr(inner_tensor):
                        continue
                """,
            ),
        ],
    )


def mark_opaque_attr_builder(builder: Any) -> None:
    """Called from the edited ``VariableBuilder.wrap_tensor``: ``builder``
    wraps an inner attr of a subclass input, so a registered DeviceMesh /
    ProcessGroup it meets is an opaque graph input (the edited
    ``VariableBuilder._wrap``, points/distributed_opaques.py; Note [State
    between points])."""
    point_state.OPAQUE_ATTR_BUILDERS.set(builder, True)


def _build_wrap_tensor(original):
    """``torch._dynamo.variables.builder.VariableBuilder.wrap_tensor`` (torch
    2.11.0) with two edits. Differs from 2.11: flatten attrs that are not
    tensors or reference opaques are rejected up front (2.12's check), inner
    attrs are marked for the ``dynamo.VariableBuilder._wrap`` edit, and with
    ``install(dtensor=True)`` DTensor's 2.13 flatten context is accepted.
    Note [install() is transparent without opaques]: identical (torch's own
    source; the inserted check passes every tensor; the named exception
    otherwise)."""
    # 2.12 rejects flatten attrs that are neither tensors nor reference
    # opaques up front, with an error that names the attr (2.11 failed later,
    # deep inside fakeification).
    return edited_function(
        original,
        [
            Edit(
                """
                for attr in attrs:
                    inner_value = getattr(value, attr)
                    inner_source = AttrSource(self.source, attr)
                    LazyVariableTracker.realize_all(
                        VariableBuilder(self.tx, inner_source)(inner_value)
                    )
                """,
                """
                for attr in attrs:
                    inner_value = getattr(value, attr)
                    __tsrt__._check_tensor_flatten_attr(value, attr, inner_value)
                    inner_source = AttrSource(self.source, attr)
                    _tsrt_builder = VariableBuilder(self.tx, inner_source)
                    # an opaque attr: a registered DeviceMesh / ProcessGroup
                    # is a graph input here, not 2.11's constant variable
                    # (dynamo.VariableBuilder._wrap)
                    __tsrt__.mark_opaque_attr_builder(_tsrt_builder)
                    LazyVariableTracker.realize_all(_tsrt_builder(inner_value))
                """,
            ),
            _WRAP_TENSOR_DTENSOR_CTX,
        ],
    )


_WRAP_TENSOR_DTENSOR_CTX = Edit(
    # install(dtensor=True) gives DTensor torch 2.13's flatten (mesh as an
    # inner attr; points/dtensor.py): this branch must accept its context
    # as well as 2.11's. Without that group DTensor's context is 2.11's and
    # the check is the same as torch's.
    """
    if not (
        len(flattening_ctx) == 2
        and flattening_ctx[0] == value._spec
        and flattening_ctx[1] == value.requires_grad
    ):
    """,
    """
    if not __tsrt__.flatten_ctx_ok(value, flattening_ctx):
    """,
)


def _build_dynamic_getattr(original):
    """``torch._dynamo.variables.tensor.TensorVariable.dynamic_getattr``
    (torch 2.11.0) with one edit. Differs from 2.11, as 2.12: an attr of an
    intermediate subclass may be an opaque (see below).
    Note [install() is transparent without opaques]: identical (torch's own
    source; without opaques no attr is a FakeScriptObject, and a tensor
    passes the check exactly as it passed 2.11's assert)."""
    # `y.mesh` on an intermediate subclass (no source): 2.11 asserts a
    # flatten attr is a tensor. 2.12 also accepts an opaque (wrap_fx_proxy
    # turns a real reference opaque into a FakeScriptObject-backed
    # TorchScriptObjectVariable) and wraps an attr that is already a
    # FakeScriptObject (an opaque put into a subclass inside the graph) as is.
    return edited_function(
        original,
        [
            Edit(
                """
                if name in attrs:
                    # attrs returned from tensor_flatten are always tensors
                    assert isinstance(example_value, torch.Tensor)
                """,
                """
                if isinstance(
                    example_value, torch._library.fake_class_registry.FakeScriptObject
                ):
                    return TorchScriptObjectVariable.create(proxy, example_value)
                if name in attrs:
                    # attrs returned from tensor_flatten are tensors or opaques
                    if not __tsrt__.is_tensor_or_opaque(example_value):
                        raise AssertionError(
                            f"Expected Tensor or OpaqueBase, got {type(example_value)}"
                        )
                """,
            ),
        ],
    )


def _build_handle_traced_output(original):
    """``torch._dynamo.variables.builder.handle_traced_output`` (torch
    2.11.0) with one edit. Differs from 2.11, as 2.12: an op output that is
    a FakeScriptObject is wrapped as is. Note [install() is transparent
    without opaques]: identical (torch's own source; the new branch only
    matches a FakeScriptObject, i.e. an opaque)."""
    # An op whose output is already a FakeScriptObject (e.g. getitem on the
    # flatten ctx/attrs of a fake subclass, as compiled autograd's backward
    # prologue does): 2.11 has no branch for it and graph-breaks with
    # "torch.* op returned non-Tensor". 2.12 wraps the proxy as is.
    return edited_function(
        original,
        [
            Edit(
                """
                elif is_opaque_type(type(example_value)):
                """,
                """
                elif isinstance(
                    example_value, torch._library.fake_class_registry.FakeScriptObject
                ):
                    return TorchScriptObjectVariable.create(proxy, example_value)
                elif is_opaque_type(type(example_value)):
                """,
            ),
        ],
    )


def _build_handle_traced_output_2_10(original):
    """``torch._dynamo.variables.builder.handle_traced_output`` (torch
    2.10.0) with one edit. Differs from 2.10, as 2.11 plus 2.12: an op
    output that is a reference opaque (``y.mesh`` read off an intermediate
    subclass: its fake carries the caller's object) becomes a
    ``TorchScriptObjectVariable`` of its fake (2.11's opaque branch), and
    one that is already a FakeScriptObject is wrapped as is (2.12, as the
    2.11 variant above). 2.10 graph-breaks on both ("torch.* op returned
    non-Tensor"). Note [install() is transparent without opaques]:
    identical (torch's own source; the new branches only match opaques)."""
    return edited_function(
        original,
        [
            Edit(
                """
                else:
                    unimplemented(
                        gb_type="torch.* op returned non-Tensor",
                """,
                """
                elif isinstance(
                    example_value, torch._library.fake_class_registry.FakeScriptObject
                ):
                    return TorchScriptObjectVariable.create(proxy, example_value)
                elif __tsrt__.is_opaque_attr(example_value, fake=False):
                    return TorchScriptObjectVariable.create(
                        proxy,
                        torch._library.fake_class_registry.maybe_to_fake_obj(
                            tx.output.fake_mode, example_value
                        ),
                    )
                else:
                    unimplemented(
                        gb_type="torch.* op returned non-Tensor",
                """,
            ),
        ],
    )


def _build_codegen_call(original):
    """``torch._dynamo.codegen.PyCodegen.__call__`` (torch 2.11.0) with one
    edit. Differs from 2.11: an opaque can be a graph output (2.12), and a
    value-type opaque made in the function is loaded as a global (2.13
    prints it through ``__fx_repr__``; see below). Note [install() is
    transparent without opaques]: identical (torch's own source; the added
    class is only built for opaques)."""
    # Returning an opaque (`return y, y.mesh`): its TorchScriptObjectVariable
    # is a graph output like a tensor (2.12 adds it to this isinstance list).
    # A value-type opaque constant built in the function has no graph node;
    # it is loaded as a global instead (2.11's FX codegen cannot print it).
    # codegen.py does not import the class, so it is named through `torch`.
    return edited_function(
        original,
        [
            Edit(
                """
                elif isinstance(
                    value,
                    (
                        TensorVariable,
                        SymNodeVariable,
                        UnspecializedPythonVariable,
                        NumpyNdarrayVariable,
                    ),
                ):
                """,
                """
                elif isinstance(
                    value, torch._dynamo.variables.script_object.TorchScriptObjectVariable
                ) and not isinstance(value.proxy, torch.fx.Proxy):
                    # A value-type opaque made inside the function (no graph
                    # node: its "proxy" is the object). 2.11's FX codegen would
                    # write its repr into the graph's source (SyntaxError);
                    # 2.13 emits it through __fx_repr__. Equal by value either
                    # way, so the bytecode loads the object itself.
                    output.append(
                        self.create_load_global(
                            self.tx.output.install_global_by_id(
                                "___tsrt_opaque_value", value.proxy
                            ),
                            add=True,
                        )
                    )
                elif isinstance(
                    value,
                    (
                        TensorVariable,
                        SymNodeVariable,
                        UnspecializedPythonVariable,
                        NumpyNdarrayVariable,
                        torch._dynamo.variables.script_object.TorchScriptObjectVariable,
                    ),
                ):
                """,
            ),
        ],
    )


def _apply_func_to_inner_tensors_of_same_dim(
    func: Callable[..., Any], t: object, *args: Any, **kwargs: Any
) -> None:
    """Replaces ``torch._dynamo.decorators._apply_func_to_inner_tensors_of_same_dim``
    (torch 2.11.0). Differs: opaque attrs are skipped (they have no dims), as
    in torch 2.12; anything else that is not a tensor is an error.
    Note [install() is transparent without opaques]: identical for tensor attrs (2.11's
    loop: same attrs, same dim test, same calls).
    """
    assert is_traceable_wrapper_subclass(t)

    attrs, _ctx = t.__tensor_flatten__()
    assert isinstance(t, torch.Tensor)
    for attr in attrs:
        inner = getattr(t, attr)
        if is_opaque_attr(inner):
            continue
        if not isinstance(inner, torch.Tensor):
            raise AssertionError(f"expected Tensor or OpaqueBase, got {type(inner)}")
        if inner.dim() == t.dim():
            func(inner, *args, **kwargs)


def _build_apply_func_to_inner_tensors_of_same_dim(original: Any) -> Any:
    """Installs :func:`_apply_func_to_inner_tensors_of_same_dim` so Dynamo
    does not trace it, as it does not trace torch's (its file is under
    ``torch/_dynamo``, which Dynamo's trace rules skip): reached while
    tracing -- ``maybe_mark_dynamic`` in a NestedTensor built inside the
    compiled function -- torch's graph-breaks. Ours lives outside torch and
    would be inlined instead, failing on its first assert (a hard error where
    stock falls back to eager). ``torch._dynamo.disable`` (this frame only)
    gives the same graph break; called eagerly it runs unchanged.
    """
    return torch._dynamo.disable(_apply_func_to_inner_tensors_of_same_dim, recursive=False)


POINTS = [
    PatchPoint(
        name="dynamo._automatic_dynamic",
        target="torch._dynamo.variables.builder:_automatic_dynamic",
        series=("0003 torch/_dynamo/variables/builder.py::_automatic_dynamic",),
        build=_build_automatic_dynamic,
        reason="\"'Mesh' object has no attribute 'is_nested'\": recursed into opaque attrs",
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="dynamo.VariableBuilder.wrap_tensor",
        target="torch._dynamo.variables.builder:VariableBuilder.wrap_tensor",
        # 0012: its inner attrs are built as subclass inner attrs (the
        # DeviceMesh / ProcessGroup path of distributed_opaques.py)
        series=(
            "0003 torch/_dynamo/variables/builder.py::VariableBuilder.wrap_tensor",
            "0003 torch/_dynamo/variables/builder.py::_check_tensor_flatten_attr",
            "0012 torch/_dynamo/variables/builder.py::VariableBuilder.wrap_tensor",
            # the DTensor branch's flatten-context check (_WRAP_TENSOR_DTENSOR_CTX)
            "0014 torch/_dynamo/variables/builder.py::VariableBuilder.wrap_tensor",
        ),
        build=_build_wrap_tensor,
        reason="clear error for flatten attrs that are not tensors or reference opaques",
        guarded_by=(
            "test/points/test_point_guards.py::TestPointGuards::test_value_type_opaque_in_tensor_attrs_errors_eager_backend",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="dynamo.TensorVariable.dynamic_getattr",
        target="torch._dynamo.variables.tensor:TensorVariable.dynamic_getattr",
        series=("0003 torch/_dynamo/variables/tensor.py::TensorVariable.dynamic_getattr",),
        build=_build_dynamic_getattr,
        reason="reading an opaque attr off an intermediate subclass (y.mesh)",
        guarded_by=(
            "test/runtime/test_opaque_attr_tracing.py::TestOpaqueAttrTracingCPU::test_return_intermediate_mesh_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    *per_release(
        name="dynamo.handle_traced_output",
        target="torch._dynamo.variables.builder:handle_traced_output",
        # the v2.10.0 form of the series entry adds the whole opaque branch
        # (2.10 has none)
        series=("0003 torch/_dynamo/variables/builder.py::handle_traced_output",),
        v2_11=dict(
            build=_build_handle_traced_output,
            reason="an op returning a FakeScriptObject graph-broke ('torch.* op returned non-Tensor')",
            guarded_by=(
                "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_opaque_backward_compiled_autograd_cpu",
            ),
        ),
        # 2.10 refuses compiled autograd with saved opaques
        # (aot_autograd.AOTDispatchAutograd.post_compile)
        v2_10=dict(
            build=_build_handle_traced_output_2_10,
            reason="reading an opaque attr off an intermediate subclass graph-broke ('torch.* op returned non-Tensor')",
            guarded_by=(
                "test/runtime/test_opaque_attr_tracing.py::TestOpaqueAttrTracingCPU::test_return_intermediate_mesh_cpu",
            ),
        ),
    ),
    PatchPoint(
        name="dynamo.PyCodegen.__call__",
        target="torch._dynamo.codegen:PyCodegen.__call__",
        series=(
            "0003 torch/_dynamo/codegen.py::PyCodegen.__call__",
            "0008 torch/_dynamo/codegen.py::PyCodegen.__call__",
        ),
        build=_build_codegen_call,
        reason="an opaque (TorchScriptObjectVariable) returned as a graph output",
        guarded_by=(
            "test/runtime/test_opaque_attr_tracing.py::TestOpaqueAttrTracingCPU::test_return_intermediate_mesh_cpu",
            "test/runtime/test_opaque_subclass_parity.py::TestOpaqueSubclassParityCPU"
            "::test_return_value_opaque_constant_cpu",
            "test/runtime/test_opaque_subclass_parity.py::TestOpaqueSubclassParityCPU"
            "::test_tensor_subclass_with_opaque_attr_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="dynamo._apply_func_to_inner_tensors_of_same_dim",
        target="torch._dynamo.decorators:_apply_func_to_inner_tensors_of_same_dim",
        series=("0003 torch/_dynamo/decorators.py::_apply_func_to_inner_tensors_of_same_dim",),
        build=_build_apply_func_to_inner_tensors_of_same_dim,
        reason="mark_dynamic & co. called .dim() on opaque attrs",
        guarded_by=(
            "test/runtime/test_opaque_attr_tracing.py::TestOpaqueAttrTracingCPU::test_mark_dynamic_cpu",
        ),
        **ONLY_BACKPORT,
    ),
]
