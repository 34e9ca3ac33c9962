"""``isinstance(x, OpaqueBase)`` for a registered opaque (upstream PR 180530).

Upstream PR 180530, carried into torch 2.12.0 / 2.12.1 (native+fixes); torch
2.10 / 2.11 take the same rule from ``distributed_opaques`` (series 0012).
See Note [Upstream fixes] in ``points/__init__.py``.

Releases and modes: 2.12.0, 2.12.1 (native+fixes).
Series commits: none.
Upstream: PR 180530.
"""

from __future__ import annotations

from .._torch_compat import is_registered_opaque_object
from ..patching.registry import PatchPoint
from ._versions import upstream_fix


def _build_registered_opaque_instancecheck(original):
    from torch._opaque_base import OpaqueBase

    def __instancecheck__(cls, instance):
        """Stands in for ``torch._opaque_base.OpaqueBaseMeta.__instancecheck__``
        (torch 2.12.0, 2.12.1).

        Differs for ``isinstance(x, OpaqueBase)`` only: an instance of any
        registered opaque type, or a FakeScriptObject of one, is an opaque
        object, as on torch >= 2.13 (upstream PR 180530). Those releases
        register the pybind ``ProcessGroup`` as a reference opaque (its
        metaclass is ``OpaqueBaseMeta``) but check the base nominally, and it
        does not derive from ``OpaqueBase``: every "expected Tensor or
        OpaqueBase" check of AOTAutograd refused a process group among a
        subclass's inner attrs. A concrete subclass keeps the release's check.
        """
        if original(cls, instance):
            return True
        return cls is OpaqueBase and is_registered_opaque_object(instance)

    return __instancecheck__


POINTS = [
    PatchPoint(
        name="library.OpaqueBaseMeta.__instancecheck__.registered_opaque",
        target="torch._opaque_base:OpaqueBaseMeta.__instancecheck__",
        build=_build_registered_opaque_instancecheck,
        reason="a ProcessGroup among a subclass's inner attrs failed AOTAutograd's "
        "'expected Tensor or OpaqueBase' check",
        upstream_fix="PR 180530",
        series_none="torch 2.10/2.11 take the same rule from "
        "library.OpaqueBaseMeta.__instancecheck__ (series patch 0012); "
        "this point is its native+fixes counterpart on 2.12",
        guarded_by=(
            "test/points/test_registered_opaque_instancecheck.py::TestRegisteredOpaqueInstancecheck::test_process_group_is_an_opaque_base",
            "test/points/test_registered_opaque_instancecheck.py::TestRegisteredOpaqueInstancecheck::test_process_group_attr_matmul_aot_eager",
            "test/points/test_registered_opaque_instancecheck.py::TestRegisteredOpaqueInstancecheck::test_process_group_attr_matmul_inductor",
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_process_group_in_attrs_aot_eager_cpu",
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_process_group_in_attrs_inductor_cpu",
        ),
        **upstream_fix("2.12.0", "2.12.1"),
    ),
]
