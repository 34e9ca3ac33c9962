"""Declared patch points, one module per torch subsystem.

Each public module exposes ``POINTS: list[PatchPoint]``. :func:`all_points`
is the registry: the one list ``install()`` selects from by torch version and
mode.

Note [One module per torch subsystem]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A point is declared in the module of the torch package its target lives in
(``SUBSYSTEMS`` names each module's packages; ``dynamo`` holds every
``VariableBuilder`` point, ``library`` every ``FakeScriptObject`` one), and
its name is ``<module>.<target attribute>[.<what it fixes>]``. What a point
is for -- its torch versions, modes, opt-in group, the upstream fix it
carries, its series counterpart -- are fields of the point, never the module
it sits in. The replacement code several subsystems share, one change at a
time, lives in the private modules (``_torch_2_11_base``: what torch 2.11
has and 2.10 lacks; ``_opaque_members``; ``_distributed_opaques``;
``_derived_submesh``; ``_dtensor``; ``_lazy_members``; ``_upstream_fixes``;
``_tracing``; ``_functional``; ``_parametrize``; ``_validation``), which
declare no point. test/points/test_point_layout.py checks all of it.

Note [Points shared by torch 2.10 and 2.11]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The backport is one set of points for both releases (``ONLY_BACKPORT``). A
replacement's docstring names the 2.11.0 function it replaces; on 2.10.0 the
target is the same function, and every source edit is checked against 2.10's
text when it is built (an edit that does not match fails the install, before
anything is touched). Where 2.10 needs something else, the point is declared
once with ``_versions.per_release`` (its 2.11 and 2.10 builds, and whatever
else differs, e.g. ``fake_tensors.is_fake``, whose importers differ), which
yields one ``ONLY_2_11`` and one ``ONLY_2_10`` point of one name, so status,
ablation and the series map see one point per release. What 2.10 cannot take
(DTensor's opaque-mesh flatten, whose DTensor internals differ) is
``ONLY_2_11``; what 2.11 already has and 2.10 lacks (opaque members,
``guard_fn``, opaques saved for backward) is ``ONLY_2_10``.

Note [Install order of stacked points]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Two points of one release and mode may share a target only when the second
carries an upstream fix (``upstream_fix``) that wraps the first's
replacement (``registry.plan``). :func:`all_points` therefore puts every
point that carries an upstream fix after every point that does not, keeping
the declared order otherwise; no other order between points matters (every
replacement is built from torch's original before any is set).
"""

from __future__ import annotations

import importlib

from ..patching.registry import PatchPoint

#: the point modules, each with the torch packages its targets live in (the
#: longest matching package decides; Note [One module per torch subsystem])
SUBSYSTEMS: dict[str, tuple[str, ...]] = {
    "aot_autograd": ("torch._functorch._aot_autograd", "torch._functorch.aot_autograd"),
    "partitioners": ("torch._functorch.partitioners",),
    "library": ("torch._library", "torch._opaque_base", "torch_subclass_rt._opaque_base"),
    "fake_tensors": ("torch._subclasses",),
    "fx": ("torch.fx",),
    "guards": ("torch._dynamo.guards",),
    "dynamo": ("torch._dynamo",),
    "inductor": ("torch._inductor",),
    "export": ("torch._export", "torch.export"),
    "nn": ("torch.nn",),
    "distributed": ("torch.distributed",),
    "utils": ("torch.utils",),
}


def subsystem_of(target: str) -> str | None:
    """The point module a ``"module:attr"`` target belongs in."""
    module = target.partition(":")[0]
    best: tuple[int, str] | None = None
    for name, packages in SUBSYSTEMS.items():
        for package in packages:
            if module == package or module.startswith(package + "."):
                if best is None or len(package) > best[0]:
                    best = (len(package), name)
    return None if best is None else best[1]


def install_order(points: list[PatchPoint]) -> list[PatchPoint]:
    """Note [Install order of stacked points]: upstream fixes last."""
    return sorted(points, key=lambda p: bool(p.upstream_fix))


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
    return install_order(points)
