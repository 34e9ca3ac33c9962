"""AOTAutograd's partitioners (``torch._functorch.partitioners``).

See Note [One module per torch subsystem] in ``points/__init__.py``.
"""

from __future__ import annotations

from ..patching.registry import PatchPoint
from ._versions import ONLY_2_10, per_release
from . import _derived_submesh, _torch_2_11_base


POINTS = [
    *per_release(
        name="partitioners._extract_fwd_bwd_modules",
        target="torch._functorch.partitioners:_extract_fwd_bwd_modules",
        v2_11=dict(
            build=_derived_submesh._build_extract_fwd_bwd_modules,
            reason="a real opaque saved for backward went to save_for_backward with the tensors (2.13: is_opaque_node)",
            series_none=_derived_submesh._NOT_YET_IN_SERIES,
            guarded_by=(_derived_submesh._REAL_OPAQUE_SAVED_TEST,),
        ),
        # what 2.11 has (patch 0000), with the 2.11 edit's opaque case
        v2_10=dict(
            build=_torch_2_11_base._build_extract_fwd_bwd_modules,
            reason="a saved opaque went to save_for_backward with the tensors",
            series=("0000 torch/_functorch/partitioners.py::_extract_fwd_bwd_modules",),
            guarded_by=(_torch_2_11_base._BACKWARD_TEST, _torch_2_11_base._NESTED_BACKWARD_TEST),
        ),
    ),
    PatchPoint(
        name="partitioners.solve_min_cut",
        target="torch._functorch.partitioners:solve_min_cut",
        build=_torch_2_11_base._build_solve_min_cut,
        reason="the min-cut partitioner found no cut past an opaque node (weight inf)",
        series=(
            "0000 torch/_functorch/partitioners.py::solve_min_cut",
        ),
        guarded_by=(_torch_2_11_base._BACKWARD_TEST,),
        **ONLY_2_10,
    ),
    *per_release(
        name="partitioners.default_partition",
        target="torch._functorch.partitioners:default_partition",
        reason="a forward node that is an opaque (a derived submesh) is saved, not 'Expected ... to be a tensor'",
        rebinds=("torch._functorch.aot_autograd", "torch._functorch.compilers"),
        # imports half of inductor (0.5 s); a later import while installed
        # copies the replacement, which uninstall() puts back
        rebinds_if_loaded=("torch._inductor.pattern_matcher",),
        default_args=(
            "torch._functorch.aot_autograd:aot_function",
            "torch._functorch.aot_autograd:aot_module_simplified",
            "torch._functorch.aot_autograd:aot_compile_joint_with_descriptors",
        ),
        series=(
            "0016 torch/_functorch/partitioners.py::default_partition",
            "0016 torch/_functorch/partitioners.py::is_opaque_node",
        ),
        guarded_by=(
            "test/distributed/test_device_mesh_derived_submesh.py::TestDerivedSubmesh::test_submesh_derived_in_dynamo_backward",
        ),
        v2_11=dict(build=_derived_submesh._build_default_partition),
        v2_10=dict(build=_derived_submesh._build_default_partition_2_10),
    ),
]
