"""What torch 2.11 has and torch 2.10 lacks: opaques saved for backward.

The catch-up of torch 2.10 to 2.11's opaque support (series patch 0000 of
the v2.10.0 series only): opaques saved for backward, their count and slices
in ``ViewAndMutationMeta``, the partitioners' and Inductor's opaque cases, and
the duplicate-input guard of a shared opaque. Registered members and
``guard_fn`` (the rest of patch 0000) are ``opaque_members``.

Releases and modes: 2.10.0 (backport).
Series commits:
    patches/v2.10.0/0000-aot_autograd-dynamo-inductor-Opaque-objects-saved-fo.patch,
    patches/v2.10.0/0001-aot_autograd-Opaque-reference-objects-as-inner-attrs.patch,
    patches/v2.10.0/0020-library-Resolve-registered-opaque-members-when-they-.patch.
Upstream: none (not an upstream fix).

What torch 2.11 already has and the feature builds on, for torch 2.10.

The backport of PR 176457 (every point that is not ``ONLY_2_10``) is
written against 2.11, which already carries opaque objects as graph inputs that survive a
backward. torch 2.10 has reference opaques as Dynamo graph inputs but not
the rest; the points whose code is here (``library.maybe_to_fake_obj``,
``fx._iterate_exprs``, ``partitioners.*``, ``aot_autograd.*``'s 2.10 parts,
``dynamo.VariableBuilder._can_lift_attrs_to_inputs``,
``inductor.GraphLowering.output``; all ``ONLY_2_10``) give 2.10 the 2.11 behaviour, so that the same
backport points, and the same graphs, serve both releases:

* the fake of a reference opaque keeps the caller's object (``real_obj``):
  2.10's ``maybe_to_fake_obj`` passes ``None``, so nothing can tell which
  object a fake stands for (identity guards, rebuilding the subclass with
  the runtime object, ``isinstance(fake, OpaqueBase)``);
* an opaque saved for backward (the backward rebuilds a grad with the
  caller's mesh), with 2.11's convention: forward outputs ``(*outs, *saved
  tensors, *saved opaques, *saved symints)``, backward inputs ``(*saved
  symints, *saved tensors, *saved opaques, *tangents)``; the opaques ride
  on the autograd ctx as ``ctx.opaque_objects`` (``save_for_backward``
  takes tensors only). 2.10's min-cut partitioner gives a non-tensor node
  an infinite weight (no cut exists), its default partitioner saves the
  opaque with the tensors, and ``free_symbols`` fails on it;
* Dynamo tracks a reference opaque it wraps as a graph input, so the same
  object reached through a second source (two subclass inputs sharing a
  mesh) is one input plus a duplicate-input guard (``y.mesh is x.mesh``);
  2.10 wraps it twice with no such guard, and a call that breaks the
  sharing reuses the graph compiled for the shared object;
* Inductor: a graph output may be an opaque (``ir.TorchBindObject``), as the
  forward returns the opaque the backward needs.

Each edit is the smallest change that gives 2.11's result; where 2.11
restructured a function, the edit adds only the opaque case. The graphs
equal 2.11's (test/expected/, shared with 2.11 and native 2.13).
"""

from __future__ import annotations

from typing import Any

from ..patching.registry import PatchPoint
from ..patching.source_edit import Edit, edited_function
from ._versions import ONLY_2_10

#: every point here is patch 0000 of the v2.10.0 series (Note [One numbering
#: for every series] in tools/series_map.py); torch 2.11 has it already
_SCHEMAS = "torch._functorch._aot_autograd.schemas"


def is_fake_opaque(val: Any) -> bool:
    """Whether ``val`` (an FX node's ``meta["val"]``) is the fake of an
    opaque object. The edits of ``solve_min_cut`` call it."""
    from torch._library.fake_class_registry import FakeScriptObject

    return isinstance(val, FakeScriptObject)


def split_saved_opaques(saved_values: list) -> list:
    """Take the opaque nodes out of ``saved_values`` (in place, order kept)
    and return them. The edited ``_extract_fwd_bwd_modules`` calls it once
    the saved values are final, before symbols are collected from them."""
    opaques = [n for n in saved_values if is_fake_opaque(n.meta.get("val"))]
    if opaques:
        saved_values[:] = [n for n in saved_values if not is_fake_opaque(n.meta.get("val"))]
    return opaques


def record_saved_opaques(fw_outs_saved_for_bw: list, *metas: Any) -> None:
    """Set ``num_opaque_objects_saved_for_bw`` on each metadata object, as
    2.11's ``_aot_stage2a_partition`` does. Called by its edited copy."""
    n = sum(1 for node in fw_outs_saved_for_bw if is_fake_opaque(node.meta.get("val")))
    for meta in metas:
        meta.num_opaque_objects_saved_for_bw = n


def refuse_compiled_autograd_with_opaques(opaques: Any, metadata: Any) -> None:
    """Raise when compiled autograd asks for the key of a backward that has
    saved opaques (torch 2.10's compiled autograd has no slot for them).
    Called by the edited ``CompiledFunction._compiled_autograd_key``."""
    if opaques:
        from ..runtime import errors

        raise errors.compiled_autograd_opaque_error(metadata, opaques)


def _build_maybe_to_fake_obj(original):
    """``torch._library.fake_class_registry.maybe_to_fake_obj`` (torch
    2.10.0) with one edit. Differs from 2.10, as 2.11: the fake of an opaque
    keeps the caller's object as ``real_obj`` instead of ``None``, and
    refuses a registered member the object lacks; the members themselves
    are read off that object when first read (``FakeScriptObject.__getattr__``
    of ``lazy_members.py``, PR 193452; 2.11 reads every one here). Note [install() is transparent without
    opaques]: identical (the edited line is the opaque branch; ``x is None``
    still gives ``None``)."""
    return edited_function(
        original,
        [
            Edit(
                "fake_x_wrapped = FakeScriptObject(FakeOpaqueObject(), type_name, None)",
                """
                fake_x_wrapped = FakeScriptObject(FakeOpaqueObject(), type_name, x)
                if x is not None:
                    __tsrt__.check_registered_members_exist(x)
                """,
            )
        ],
    )


def _build_iterate_exprs(original):
    """Wraps ``torch.fx.experimental.symbolic_shapes._iterate_exprs``
    (torch 2.10.0). Differs from 2.10, as 2.11: the fake of an opaque has
    no symbolic expressions (2.10 raises "cannot extract sympy expressions"
    from it while the partitioner collects the symbols of saved values).
    The original recurses through the module global, so a fake nested in
    a list reaches this wrapper too. Note [install() is transparent without
    opaques]: delegation."""

    def _iterate_exprs(val):
        if is_fake_opaque(val):
            return
        yield from original(val)

    return _iterate_exprs


def _build_extract_fwd_bwd_modules(original):
    """``torch._functorch.partitioners._extract_fwd_bwd_modules`` (torch
    2.10.0) with two edits. Differs from 2.10, as 2.11: saved opaques go
    after the saved tensors in the forward outputs and the backward inputs
    (module docstring). Note [install() is transparent without opaques]:
    identical (no saved opaque: ``split_saved_opaques`` returns [] and the
    lists are 2.10's)."""
    return edited_function(
        original,
        [
            Edit(
                """
                # Now that we have the finalized list of saved values, we need to ensure
                """,
                """
                saved_opaque_objects = __tsrt__.split_saved_opaques(saved_values)
                # Now that we have the finalized list of saved values, we need to ensure
                """,
            ),
            Edit(
                """
                    fwd_outputs + saved_values + saved_sym_nodes,
                    fwd_outputs_descs
                    + [
                        SavedForBackwardsAOTOutput(i)
                        for i in range(len(saved_values) + len(saved_sym_nodes))
                    ],
                    "forward",
                )
                bwd_graph = _extract_graph_with_inputs_outputs(
                    joint_module.graph,
                    saved_sym_nodes
                    + saved_values
                    + tangent_inputs
                """,
                """
                    fwd_outputs + saved_values + saved_opaque_objects + saved_sym_nodes,
                    fwd_outputs_descs
                    + [
                        SavedForBackwardsAOTOutput(i)
                        for i in range(
                            len(saved_values) + len(saved_opaque_objects) + len(saved_sym_nodes)
                        )
                    ],
                    "forward",
                )
                bwd_graph = _extract_graph_with_inputs_outputs(
                    joint_module.graph,
                    saved_sym_nodes
                    + saved_values
                    + saved_opaque_objects
                    + tangent_inputs
                """,
            ),
        ],
    )


def _build_solve_min_cut(original):
    """``torch._functorch.partitioners.solve_min_cut`` (torch 2.10.0) with
    one edit. Differs from 2.10, as 2.11: an opaque node weighs 0 (it can
    be saved, like a BackwardState) instead of infinity. Note [install() is
    transparent without opaques]: identical for every other node."""
    return edited_function(
        original,
        [
            Edit(
                """
                0.0 if isinstance(node.meta.get("val"), BackwardState) else math.inf
                """,
                """
                0.0
                if isinstance(node.meta.get("val"), BackwardState)
                or __tsrt__.is_fake_opaque(node.meta.get("val"))
                else math.inf
                """,
            )
        ],
    )


def _build_aot_stage2a_partition(original):
    """``torch._functorch._aot_autograd.graph_compile._aot_stage2a_partition``
    (torch 2.10.0) with one edit. Differs from 2.10, as 2.11: it records how
    many opaques the forward saves for the backward. Note [install() is
    transparent without opaques]: identical (the count is 0)."""
    return edited_function(
        original,
        [
            Edit(
                """
                inner_meta.num_symints_saved_for_bw = num_symints_saved_for_bw
                if torch._functorch.config.donated_buffer:
                """,
                """
                inner_meta.num_symints_saved_for_bw = num_symints_saved_for_bw
                __tsrt__.record_saved_opaques(fw_outs_saved_for_bw, fw_metadata, inner_meta)
                if torch._functorch.config.donated_buffer:
                """,
            )
        ],
    )


def _build_tensors_saved_slice(original):
    """``ViewAndMutationMeta.tensors_saved_for_backwards_slice`` (torch
    2.10.0). Differs from 2.10, as 2.11: it stops before the saved opaques
    as well as the saved symints. Note [install() is transparent without
    opaques]: the same slice when no opaque is saved."""

    def tensors_saved_for_backwards_slice(self):
        assert self.num_symints_saved_for_bw is not None
        trailing = self.num_symints_saved_for_bw + (self.num_opaque_objects_saved_for_bw or 0)
        return slice(self.num_forward, -trailing if trailing else None)

    return property(tensors_saved_for_backwards_slice, doc=original.__doc__)


def _build_opaques_saved_slice(_):
    """``ViewAndMutationMeta.opaque_objects_saved_for_backwards_slice``, new
    on 2.10 (2.11 has it): the saved opaques, between the saved tensors and
    the saved symints of the forward outputs."""

    def opaque_objects_saved_for_backwards_slice(self):
        num_opaque = self.num_opaque_objects_saved_for_bw or 0
        num_symints = self.num_symints_saved_for_bw or 0
        if not num_opaque:
            return slice(0, 0)
        return slice(-num_opaque - num_symints, -num_symints if num_symints else None)

    return property(opaque_objects_saved_for_backwards_slice)


def _build_autograd_post_compile(original):
    """``AOTDispatchAutograd.post_compile`` (torch 2.10.0; a staticmethod
    that defines the autograd function, ``CompiledFunction``) with two
    edits. Differs from 2.10, as 2.11: the forward keeps the saved opaques
    on the ctx (``ctx.opaque_objects``), and the backward passes them after
    the saved tensors, where the backward graph's inputs have them. 2.11
    gives ``_backward_prologue_functional`` a parameter for them; passing
    them with the saved tensors gives the same argument list, and the
    prologue's tangent-position check counts them the same way. Compiled
    autograd, whose C++ side on 2.10 cannot carry them, is refused with an
    error when it asks for the backward's key (before it traces anything).
    Note
    [install() is transparent without opaques]: identical (an empty tuple
    is added)."""
    return staticmethod(
        edited_function(
            original.__func__,
            [
                Edit(
                    """
                    def _compiled_autograd_key(ctx):
                        return (ctx._autograd_function_id, *ctx.symints)
                    """,
                    """
                    def _compiled_autograd_key(ctx):
                        __tsrt__.refuse_compiled_autograd_with_opaques(
                            ctx.opaque_objects, CompiledFunction.metadata
                        )
                        return (ctx._autograd_function_id, *ctx.symints)
                    """,
                ),
                Edit(
                    """
                    ctx.symints = symint_outs
                    """,
                    """
                    ctx.symints = symint_outs
                    ctx.opaque_objects = fw_outs[
                        CompiledFunction.metadata.opaque_objects_saved_for_backwards_slice
                    ]
                    """,
                ),
                Edit(
                    """
                    all_args = _backward_prologue_functional(
                        ctx.saved_tensors,
                    """,
                    """
                    all_args = _backward_prologue_functional(
                        (*ctx.saved_tensors, *ctx.opaque_objects),
                    """,
                ),
            ],
            strip_staticmethod=True,
        )
    )


def _build_graph_lowering_output(original):
    """``torch._inductor.graph.GraphLowering.output`` (torch 2.10.0) with one
    edit. Differs from 2.10, as 2.11: an opaque (``ir.TorchBindObject``)
    may be a graph output. Note [install() is transparent without opaques]:
    identical (one more type is accepted)."""
    return edited_function(
        original,
        [
            Edit(
                """
                    ir.ShapeAsConstantBuffer,
                ),
                """,
                """
                    ir.ShapeAsConstantBuffer,
                    ir.TorchBindObject,
                ),
                """,
            )
        ],
    )


def _build_can_lift_attrs_to_inputs(original):
    """Wraps ``VariableBuilder._can_lift_attrs_to_inputs`` (torch 2.10.0).
    Differs from 2.10, as 2.11: a wrapped reference opaque is tracked too
    (module docstring). Note [install() is transparent without opaques]:
    delegation; 2.11 tracks every ``TorchScriptObjectVariable``, this only
    an opaque's, so a TorchScript object keeps 2.10's behaviour."""
    from torch._dynamo.variables.script_object import TorchScriptObjectVariable

    from .._torch_compat import is_opaque_attr

    def _can_lift_attrs_to_inputs(self, vt):
        if type(vt) is TorchScriptObjectVariable and is_opaque_attr(vt.value):
            return True
        return original(self, vt)

    return _can_lift_attrs_to_inputs




POINTS = [
    # what 2.11 has (patch 0000), with the 2.11 edit's opaque case (torch
    # 2.11's point of this name is derived_submesh's)
    PatchPoint(
        name="aot_autograd._aot_stage2a_partition",
        target="torch._functorch._aot_autograd.graph_compile:_aot_stage2a_partition",
        build=_build_aot_stage2a_partition,
        reason="the count of opaques saved for backward was not recorded",
        series=("0000 torch/_functorch/_aot_autograd/graph_compile.py::_aot_stage2a_partition",),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="aot_autograd.ViewAndMutationMeta.num_opaque_objects_saved_for_bw",
        target=f"{_SCHEMAS}:ViewAndMutationMeta.num_opaque_objects_saved_for_bw",
        # a class-level default; _aot_stage2a_partition sets the instance's
        build=lambda _: None,
        new_attribute=True,
        reason="no field for the count of opaques saved for backward",
        series=(
            "0000 torch/_functorch/_aot_autograd/schemas.py::ViewAndMutationMeta",
        ),
        # an AOTAutogradCache entry stock torch saved has no such field; the
        # class default makes it read as "no opaque saved" under install()
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
            "test/points/test_cache_across_modes.py::TestCacheAcrossInstall::test_stock_entry_loaded_with_install",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="aot_autograd.ViewAndMutationMeta.tensors_saved_for_backwards_slice",
        target=f"{_SCHEMAS}:ViewAndMutationMeta.tensors_saved_for_backwards_slice",
        build=_build_tensors_saved_slice,
        reason="the saved-tensor slice took the saved opaques as tensors",
        series=(
            "0000 torch/_functorch/_aot_autograd/schemas.py::ViewAndMutationMeta.tensors_saved_for_backwards_slice",
        ),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="aot_autograd.ViewAndMutationMeta.opaque_objects_saved_for_backwards_slice",
        target=f"{_SCHEMAS}:ViewAndMutationMeta.opaque_objects_saved_for_backwards_slice",
        build=_build_opaques_saved_slice,
        new_attribute=True,
        reason="no slice for the saved opaques",
        series=(
            "0000 torch/_functorch/_aot_autograd/schemas.py::ViewAndMutationMeta.opaque_objects_saved_for_backwards_slice",
        ),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="aot_autograd.AOTDispatchAutograd.post_compile",
        target="torch._functorch._aot_autograd.runtime_wrappers:AOTDispatchAutograd.post_compile",
        build=_build_autograd_post_compile,
        reason="saved opaques were not kept on the ctx for the backward",
        series=(
            "0000 torch/_functorch/_aot_autograd/runtime_wrappers.py::AOTDispatchAutograd.post_compile",
            "0001 torch/_functorch/_aot_autograd/runtime_wrappers.py::AOTDispatchAutograd.post_compile",
            "0001 torch/_functorch/_aot_autograd/runtime_wrappers.py::_compiled_autograd_opaque_error",
        ),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_opaque_backward_compiled_autograd_cpu",
        ),
        **ONLY_2_10,
    ),
    # what 2.11 has (patch 0000), with the 2.11 edit's opaque case (torch
    # 2.11's point of this name is derived_submesh's)
    PatchPoint(
        name="partitioners._extract_fwd_bwd_modules",
        target="torch._functorch.partitioners:_extract_fwd_bwd_modules",
        build=_build_extract_fwd_bwd_modules,
        reason="a saved opaque went to save_for_backward with the tensors",
        series=("0000 torch/_functorch/partitioners.py::_extract_fwd_bwd_modules",),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
            # saves a computed tensor after the opaque input in graph order: without
            # the reorder the opaque lands among the saved tensors
            "test/runtime/test_opaque_attr_tracing.py::TestOpaqueAttrTracingCPU::test_nested_subclass_backward_cpu",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="partitioners.solve_min_cut",
        target="torch._functorch.partitioners:solve_min_cut",
        build=_build_solve_min_cut,
        reason="the min-cut partitioner found no cut past an opaque node (weight inf)",
        series=(
            "0000 torch/_functorch/partitioners.py::solve_min_cut",
        ),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="library.maybe_to_fake_obj",
        target="torch._library.fake_class_registry:maybe_to_fake_obj",
        build=_build_maybe_to_fake_obj,
        reason="the fake of a reference opaque had no real_obj (None)",
        series=(
            "0000 torch/_library/fake_class_registry.py::maybe_to_fake_obj",
            # on 2.10 this edit is also lazy_members' maybe_to_fake_obj
            "0020 torch/_library/fake_class_registry.py::maybe_to_fake_obj",
            "0020 torch/_library/fake_class_registry.py::_check_registered_members_exist",
        ),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_device_mesh_in_attrs_aot_eager_cpu",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="fx._iterate_exprs",
        target="torch.fx.experimental.symbolic_shapes:_iterate_exprs",
        build=_build_iterate_exprs,
        reason="'cannot extract sympy expressions' from a saved opaque",
        series=(
            "0000 torch/fx/experimental/symbolic_shapes.py::_iterate_exprs",
        ),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="dynamo.VariableBuilder._can_lift_attrs_to_inputs",
        target="torch._dynamo.variables.builder:VariableBuilder._can_lift_attrs_to_inputs",
        build=_build_can_lift_attrs_to_inputs,
        reason="no duplicate-input guard for an opaque shared by two subclass inputs",
        series=(
            "0000 torch/_dynamo/variables/builder.py::VariableBuilder._can_lift_attrs_to_inputs",
        ),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU"
            "::test_shared_opaque_identity_guard_cpu",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="inductor.GraphLowering.output",
        target="torch._inductor.graph:GraphLowering.output",
        build=_build_graph_lowering_output,
        reason="Inductor asserted that no graph output is an opaque",
        series=(
            "0000 torch/_inductor/graph.py::GraphLowering.output",
        ),
        guarded_by=(
            "test/runtime/test_opaque_subclass_parity.py::TestOpaqueSubclassParityCPU::test_inductor_fwd_bwd_cpu",
        ),
        **ONLY_2_10,
    ),
]
