"""Declared patch points, one module per torch subsystem.

Each module exposes ``POINTS: list[PatchPoint]``. :func:`all_points` is the
registry: the one list ``install()`` selects from by torch version and mode.
"""

from __future__ import annotations

import importlib

from ..patching.registry import PatchPoint

#: subsystem modules, in install order (AOTAutograd's runtime first, then the
#: layers that feed it: fake/meta tensors, guard building, Dynamo, and the
#: APIs outside torch.compile).
SUBSYSTEMS: tuple[str, ...] = (
    "aot_autograd",
    "functional",
    "tracing",
    "fake_tensors",
    "guards",
    "dynamo",
    "validation",
    "inductor",
    "export",
    "parametrize",
    "distributed",
    "distributed_opaques",
    "derived_submesh",
    "dtensor",  # opt-in group "dtensor" (install(dtensor=True))
    # last: a fix point may stack on a backport point of the same target
    "fixes",
)


#: changes of the patch series that no patch point stands for, each with why
#: none is needed ("NNNN path::qualname" -> reason); tools/series_map.py
#: checks that every other series change is named by a point's ``series``.
SERIES_WITHOUT_POINT: dict[str, str] = {
    "0001 torch/_functorch/_aot_autograd/schemas.py::SubclassCreationMeta": (
        "the type annotation of its attrs field admits OpaqueMeta; no behaviour"
    ),
    "0004 torch/_functorch/_aot_autograd/subclass_parametrization.py::SubclassCreationMeta": (
        "the type annotation of its attrs field admits OpaqueMeta; no behaviour"
    ),
    "0014 torch/_library/fake_class_registry.py::FakeScriptObject.__hash__": (
        "defining __eq__ in a class body sets __hash__ to None, so the series "
        "restates the identity hash FakeScriptObject already has; the point adds "
        "__eq__ to the existing class, which keeps that hash"
    ),
}


def all_points() -> list[PatchPoint]:
    # Every name must import: a misspelled or deleted subsystem is an error,
    # not a silently smaller install.
    points: list[PatchPoint] = []
    for name in SUBSYSTEMS:
        points.extend(importlib.import_module(f"{__name__}.{name}").POINTS)
    return points
