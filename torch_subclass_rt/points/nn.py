"""``torch.nn`` (``nn.utils.parametrize``).

See Note [One module per torch subsystem] in ``points/__init__.py``.
"""

from __future__ import annotations

from ..patching.registry import PatchPoint
from ._versions import ONLY_BACKPORT
from . import _parametrize


POINTS = [
    PatchPoint(
        name="nn.ParametrizationList.__init__",
        target="torch.nn.utils.parametrize:ParametrizationList.__init__",
        series=("0004 torch/nn/utils/parametrize.py::ParametrizationList.__init__",),
        build=_parametrize._build_parametrization_list_init,
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
        build=_parametrize._build_parametrization_list_right_inverse,
        reason="assigning a subclass re-stores its opaque original as an attribute",
        guarded_by=(
            "test/points/test_point_guards.py::TestPointGuards::test_parametrized_subclass_assigned_again",
        ),
        **ONLY_BACKPORT,
    ),
]
