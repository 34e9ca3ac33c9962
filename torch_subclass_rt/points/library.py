"""Opaque types and their fakes (``torch._library``: ``opaque_object``,
``fake_class_registry``; and ``torch._opaque_base``, the metaclass those
build on, which torch 2.10 lacks and the package ships as
``torch_subclass_rt._opaque_base``).

See Note [One module per torch subsystem] in ``points/__init__.py``.
"""

from __future__ import annotations

from .._torch_compat import BACKPORT_VERSIONS, FIXES_VERSIONS
from ..patching.registry import PatchPoint
from ._versions import ONLY_2_10, ONLY_BACKPORT, RUNTIME, upstream_fix, per_release
from . import (
    _derived_submesh,
    _distributed_opaques,
    _lazy_members,
    _opaque_members,
    _opaque_reads,
    _torch_2_11_base,
    _tracing,
    _upstream_fixes,
)


POINTS = [
    PatchPoint(
        name="library.maybe_to_fake_obj",
        target="torch._library.fake_class_registry:maybe_to_fake_obj",
        build=_torch_2_11_base._build_maybe_to_fake_obj,
        reason="the fake of a reference opaque had no real_obj (None)",
        series=(
            "0000 torch/_library/fake_class_registry.py::maybe_to_fake_obj",
            # on 2.10 this edit is also lazy_members' maybe_to_fake_obj
            "0020 torch/_library/fake_class_registry.py::maybe_to_fake_obj",
            "0020 torch/_library/fake_class_registry.py::_check_registered_members_exist",
        ),
        guarded_by=(
            _torch_2_11_base._BACKWARD_TEST,
            # the fake carries the registered members dispatch reads
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_device_mesh_in_attrs_aot_eager_cpu",
        ),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="library.MemberType",
        target=f"{_opaque_members._OO}:MemberType",
        build=lambda _original: _opaque_members.MemberType,
        new_attribute=True,
        reason="the kinds of opaque members (torch 2.11's enum)",
        series=(f"0000 torch/_library/opaque_object.py::MemberType",),
        guarded_by=(f"{_opaque_members._MEMBERS_TEST}::test_registered_by_type_and_by_name_cpu",),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="library.register_opaque_type",
        target=f"{_opaque_members._OO}:register_opaque_type",
        build=_opaque_members._build_register_opaque_type,
        reason="registration takes guard_fn and members (torch 2.11)",
        series=(
            "0000 torch/_library/opaque_object.py::register_opaque_type",
            "0000 torch/_library/opaque_object.py::_OpaqueTypeInfo",
        ),
        guarded_by=(f"{_opaque_members._MEMBERS_TEST}::test_unregistered_member_clear_error_user_opaque_cpu",),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="library.get_opaque_obj_info",
        target=f"{_opaque_members._OO}:get_opaque_obj_info",
        build=lambda _original: _opaque_members.get_opaque_obj_info,
        new_attribute=True,
        reason="look up a registration with its members and guard_fn (torch 2.11)",
        series=("0000 torch/_library/opaque_object.py::get_opaque_obj_info",),
        guarded_by=(f"{_opaque_members._MEMBERS_TEST}::test_registered_by_type_and_by_name_cpu",),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="library.get_member_type",
        target=f"{_opaque_members._OO}:get_member_type",
        build=lambda _original: _opaque_members.get_member_type,
        new_attribute=True,
        reason="how a member of an opaque is registered, for Dynamo (torch 2.11)",
        series=("0000 torch/_library/opaque_object.py::get_member_type",),
        guarded_by=(f"{_opaque_members._MEMBERS_TEST}::test_member_reads_in_dynamo_cpu",),
        **ONLY_2_10,
    ),
    PatchPoint(
        name="library.FakeScriptObject.__init__",
        target="torch._library.fake_class_registry:FakeScriptObject.__init__",
        build=_tracing._fake_script_object_init,
        reason="keep the caller's opaque as real_obj (no deepcopy), as 2.12 does",
        series=("0001 torch/_library/fake_class_registry.py::FakeScriptObject.__init__",),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_shared_opaque_backward_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="library._OPAQUE_TYPES",
        target="torch._library.opaque_object:_OPAQUE_TYPES",
        # the series registers both classes when torch.distributed.tensor is
        # imported, past register_opaque_type's metaclass check
        series=(
            "0012 torch/distributed/device_mesh.py::_register_distributed_opaque_types",
            "0012 torch/distributed/device_mesh.py::_distributed_opaque_types_registered",
            "0012 torch/distributed/device_mesh.py::_DEVICE_MESH_MEMBERS",
            "0012 torch/distributed/device_mesh.py::_PROCESS_GROUP_MEMBERS",
            "0012 torch/distributed/device_mesh.py::_device_mesh_guard_fn",
            "0012 torch/distributed/tensor/_api.py::<module>",
            "0012 torch/_library/opaque_object.py::_register_opaque_type_info",
            "0012 torch/_library/opaque_object.py::register_opaque_type",
        ),
        build=_distributed_opaques._build_opaque_types,
        reason="register DeviceMesh / ProcessGroup as reference opaques (2.13's members and guard)",
        # infer_schema maps an annotation to its opaque type name through it
        rebinds=("torch._library.infer_schema",),
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_device_mesh_in_attrs_aot_eager_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="library._OPAQUE_TYPES_BY_NAME",
        target="torch._library.opaque_object:_OPAQUE_TYPES_BY_NAME",
        series=("0012 torch/_library/opaque_object.py::_register_opaque_type_info",),
        build=_distributed_opaques._build_opaque_types_by_name,
        reason="the same registration, looked up by type name (custom-op schemas, Dynamo)",
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_registered_by_type_and_by_name_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    *per_release(
        name="library.OpaqueBaseMeta.__instancecheck__",
        series=("0012 torch/_opaque_base.py::OpaqueBaseMeta.__instancecheck__",),
        build=_distributed_opaques._build_instancecheck,
        reason="isinstance(x, OpaqueBase) asks the registry (2.13), so a DeviceMesh is an opaque object",
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_device_mesh_in_attrs_aot_eager_cpu",
        ),
        v2_11=dict(target="torch._opaque_base:OpaqueBaseMeta.__instancecheck__"),
        # 2.10 has no torch._opaque_base (the series' patch 0000 adds it):
        # the same rule on the package's own OpaqueBase
        v2_10=dict(target="torch_subclass_rt._opaque_base:OpaqueBaseMeta.__instancecheck__"),
    ),
    PatchPoint(
        name="library.FakeScriptObject.__getattribute__",
        target="torch._library.fake_class_registry:FakeScriptObject.__getattribute__",
        series=(
            "0012 torch/_library/fake_class_registry.py::FakeScriptObject.__getattribute__",
            "0012 torch/_library/opaque_object.py::unregistered_opaque_member_error",
        ),
        build=_distributed_opaques._build_getattribute,
        reason="an unregistered member read while tracing names the type, member and members={...}",
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_unregistered_member_clear_error_cpu",
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_unregistered_member_clear_error_user_opaque_cpu",
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_fake_mesh_isinstance_cpu",
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_fake_mesh_as_collective_group_cpu",
        ),
        **RUNTIME,
    ),
    *(
        PatchPoint(
            name=f"library.FakeScriptObject.{attr}",
            target=f"torch._library.fake_class_registry:FakeScriptObject.{attr}",
            build=lambda _original, fn=fn: fn,
            reason="fakes of one object compare equal and hash alike (torch 2.13)",
            new_attribute=new,
            **({"series": series} if series else {"series_none": _distributed_opaques._NOT_YET_IN_SERIES}),
            guarded_by=(
                "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_fakes_of_one_object_equal_cpu",
                "test/distributed/test_dtensor_scenarios.py::test_scenario[tp_mlp-aot_eager]",
            ),
            **ONLY_BACKPORT,
        )
        # __hash__: torch 2.11's class has object's (not its own attribute)
        for attr, fn, new, series in (
            (
                "__eq__",
                _distributed_opaques._fake_eq,
                True,
                (
                    "0014 torch/_library/fake_class_registry.py::FakeScriptObject.__eq__",
                    "0014 torch/_library/fake_class_registry.py::maybe_unwrap_fake_script_object",
                ),
            ),
            # the series' 0014 hashes by identity: this point's hash is not ported yet
            ("__hash__", _distributed_opaques._fake_hash, True, ()),
        )
    ),
    PatchPoint(
        name="library.FakeScriptObject.__deepcopy__",
        target="torch._library.fake_class_registry:FakeScriptObject.__deepcopy__",
        build=lambda _original: _distributed_opaques._fake_deepcopy,
        reason="a deep copy of a fake re-reads its members off a copy of its object (torch 2.13)",
        new_attribute=True,
        series_none=_distributed_opaques._NOT_YET_IN_SERIES,
        guarded_by=("test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_fake_mesh_deepcopy_cpu",),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="library.FakeScriptObject.__getitem__",
        target="torch._library.fake_class_registry:FakeScriptObject.__getitem__",
        build=lambda _original: _derived_submesh.fake_getitem,
        reason="mesh['tp'] on the fake mesh a __torch_dispatch__ sees while tracing (2.13 has it)",
        new_attribute=True,
        series=("0016 torch/_library/fake_class_registry.py::FakeScriptObject.__getitem__",),
        guarded_by=(
            "test/distributed/test_device_mesh_derived_submesh.py::TestDerivedSubmesh::test_submesh_derived_in_dispatch",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="library.OpaqueBaseMeta.__instancecheck__.registered_opaque",
        target="torch._opaque_base:OpaqueBaseMeta.__instancecheck__",
        build=_upstream_fixes._build_registered_opaque_instancecheck,
        reason="a ProcessGroup among a subclass's inner attrs failed AOTAutograd's "
        "'expected Tensor or OpaqueBase' check",
        upstream_fix="PR 180530",
        series_none="torch 2.10/2.11 take the same rule from "
        "library.OpaqueBaseMeta.__instancecheck__ (series patch 0012); "
        "this point is its native+fixes counterpart on 2.12",
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_process_group_in_attrs_aot_eager_cpu",
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_process_group_in_attrs_inductor_cpu",
        ),
        **upstream_fix("2.12.0", "2.12.1"),
    ),
    PatchPoint(
        name="library.maybe_to_fake_obj.lazy_members",
        target="torch._library.fake_class_registry:maybe_to_fake_obj",
        build=_lazy_members._build_maybe_to_fake_obj,
        reason="every registered member of an opaque was evaluated at each fakification, "
        "and INLINED methods were bound to the real object",
        upstream_fix=_lazy_members._FIX,
        series=(f"{_lazy_members._F}maybe_to_fake_obj", f"{_lazy_members._F}_check_registered_members_exist"),
        rebinds_if_loaded=_lazy_members._importers(
            "torch._export.passes.lift_constants_pass", "torch.export._trace", "torch._inductor.ir"
        ),
        guarded_by=_lazy_members._TESTS,
        # not 2.10: install()'s library.maybe_to_fake_obj builds the
        # fake there, members unread (this point stacked on it would leave it
        # nothing to do)
        **upstream_fix("2.11.0", *FIXES_VERSIONS),
    ),
    PatchPoint(
        name="library.FakeScriptObject.__getattr__.lazy_members",
        target="torch._library.fake_class_registry:FakeScriptObject.__getattr__",
        build=lambda _original: _lazy_members._fake_getattr,
        new_attribute=True,
        reason="the fake of an opaque resolves a registered member when it is read",
        upstream_fix=_lazy_members._FIX,
        series=(f"{_lazy_members._F}FakeScriptObject.__getattr__", f"{_lazy_members._F}_resolve_registered_member"),
        guarded_by=(
            f"{_lazy_members._TEST}test_member_read_by_dispatch",
            f"{_lazy_members._TEST}test_inlined_member_side_effect_on_runtime_object",
        ),
        # every release with opaque members: the native ones we patch, and
        # the backport (on 2.10, the fake library.maybe_to_fake_obj makes);
        # the series carry it as patch 0020
        **upstream_fix(*BACKPORT_VERSIONS, *FIXES_VERSIONS),
    ),
    PatchPoint(
        name="library.FakeScriptObject.__getattribute__.opaque_reads",
        target="torch._library.fake_class_registry:FakeScriptObject.__getattribute__",
        build=_opaque_reads._build_fake_getattribute,
        reason="the USE_REAL members tracing reads off an opaque's fake are recorded "
        "for the AOTAutograd cache",
        upstream_fix=_opaque_reads.FIX,
        series_none=_opaque_reads.SERIES_NONE,
        guarded_by=_opaque_reads.READ_TESTS,
        **upstream_fix(*_opaque_reads.BROKEN_ON),
    ),
]
