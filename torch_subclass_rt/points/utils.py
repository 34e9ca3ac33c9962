"""``torch.utils`` (``torch.utils.weak``).

See Note [One module per torch subsystem] in ``points/__init__.py``.
"""

from __future__ import annotations

from ..patching.registry import PatchPoint
from ._versions import ONLY_BACKPORT
from . import _distributed_opaques


POINTS = [
    PatchPoint(
        name="utils.weak._WeakHashRef",
        target="torch.utils.weak:_WeakHashRef",
        # its one user: the proxy tracer's script_object_tracker
        rebinds=("torch.fx.experimental.proxy_tensor",),
        build=_distributed_opaques._build_weak_hash_ref,
        reason="the proxy tracer keeps fakes by identity now that they hash as their object",
        series_none=_distributed_opaques._NOT_YET_IN_SERIES,
        guarded_by=(
            "test/distributed/test_device_mesh_opaque.py::TestDeviceMeshOpaqueCPU::test_fakes_of_one_object_tracked_apart_cpu",
        ),
        **ONLY_BACKPORT,
    ),
]
