"""Declared patch points, one module per torch subsystem.

Each module exposes ``POINTS: list[PatchPoint]``. :func:`all_points` is the
registry: the one list ``install()`` selects from by torch version and mode.

Note [Points shared by torch 2.10 and 2.11]: the backport is one set of
points for both releases (``ONLY_BACKPORT``). A replacement's docstring
names the 2.11.0 function it replaces; on 2.10.0 the target is the same
function, and every source edit is checked against 2.10's text when it is
built (an edit that does not match fails the install, before anything is
touched). Where 2.10 needs something else, the point is declared twice
under one name: ``ONLY_2_11`` and ``ONLY_2_10`` (e.g. ``fake.is_fake``,
whose importers differ), so status, ablation and the series map see one
point per release. What 2.10 cannot take (DTensor's opaque-mesh flatten,
whose DTensor internals differ) is ``ONLY_2_11``; what 2.11 already has
and 2.10 lacks is ``torch_2_11_base`` and ``opaque_members`` (opaque
members and ``guard_fn``; ``ONLY_2_10``).
"""

from __future__ import annotations

import importlib

from ..patching.registry import PatchPoint

#: subsystem modules, in install order (AOTAutograd's runtime first, then the
#: layers that feed it: fake/meta tensors, guard building, Dynamo, and the
#: APIs outside torch.compile).
SUBSYSTEMS: tuple[str, ...] = (
    # torch 2.10 only: what 2.11 has and the rest builds on
    "torch_2_11_base",
    "opaque_members",
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
    # PR 193452's fix (resolve opaque members when read), on every release
    # with opaque members; after torch_2_11_base, whose maybe_to_fake_obj
    # it wraps on 2.10
    "lazy_members",
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
    # v2.10.0 only (patch 0000: what torch 2.11 has)
    **{
        f"0000 torch/_opaque_base.py::{unit}": (
            "torch 2.11's OpaqueBase, which torch 2.10 lacks: on 2.10 the package "
            "ships its own (torch_subclass_rt/_opaque_base.py, tsrt.OpaqueBase; "
            "Note [OpaqueBase on torch 2.10]), a class of ours, not a patch point"
        )
        for unit in ("OpaqueBase", "OpaqueBaseMeta", "OpaqueBaseMeta.__instancecheck__")
    },
}


def all_points() -> list[PatchPoint]:
    # Every name must import: a misspelled or deleted subsystem is an error,
    # not a silently smaller install.
    points: list[PatchPoint] = []
    for name in SUBSYSTEMS:
        points.extend(importlib.import_module(f"{__name__}.{name}").POINTS)
    return points
