"""Declared patch points, one module per change.

Each public module is one change and exposes ``POINTS: list[PatchPoint]``.
:func:`all_points` is the registry: the one list ``install()`` selects from
by torch version and mode.

Note [One module per change]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A change is one commit of the patch series (``patches/v<version>/``), an
upstream PR or issue whose fix we carry (``upstream_fix``), the catch-up of
what torch 2.11 has and 2.10 lacks (``torch_2_11_base``, ``opaque_members``),
or a torch bug we fix (``opaque_reads``). Its module (``CHANGES``) holds its
``PatchPoint`` declarations and their build code together, and its docstring
says what the change is, the releases and modes it applies to, its series
commit(s) and its upstream PR or issue. A point's name is
``<subsystem>.<target attribute>[.<what it fixes>]``: the subsystem (the torch
package its target lives in) is a computed view, :func:`subsystem_of` /
:func:`by_subsystem` (``python -m torch_subclass_rt status --by-subsystem``),
not the module it sits in. Every ``name``, ``guarded_by`` test id and
``series`` entry is a literal in its declaration (grep finds a point and the
tests that guard it). The private modules declare no point and belong to no
change: ``_versions`` (the version sets), ``_edit_api`` (what edited torch
source may call) and ``_dynamo_opaque`` (the checks edited Dynamo source
calls). No points module imports another's private names.
test/points/test_point_layout.py checks all of it.

Note [Points shared by torch 2.10 and 2.11]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The backport is one set of points for both releases (``ONLY_BACKPORT``). A
replacement's docstring names the 2.11.0 function it replaces; on 2.10.0 the
target is the same function, and every source edit is checked against 2.10's
text when it is built (an edit that does not match fails the install, before
anything is touched). Where 2.10 needs something else within one change, the
point is declared once with ``_versions.per_release`` (its 2.11 and 2.10
builds, and whatever else differs, e.g. ``fake_tensors.is_fake``, whose
importers differ), which yields one ``ONLY_2_11`` and one ``ONLY_2_10`` point
of one name, so status, ablation and the series map see one point per
release. Where the two releases' points of one name belong to two changes
(``aot_autograd._aot_stage2a_partition`` and
``partitioners._extract_fwd_bwd_modules``: torch 2.10's is
``torch_2_11_base``'s, 2.11's is ``derived_submesh``'s), each change declares
its own, ``ONLY_2_10`` and ``ONLY_2_11``. What 2.10 cannot take (DTensor's
opaque-mesh flatten, whose DTensor internals differ) is ``ONLY_2_11``; what
2.11 already has and 2.10 lacks (opaque members, ``guard_fn``, opaques saved
for backward) is ``ONLY_2_10``.

Note [Install order of stacked points]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Two points of one release and mode may share a target only when the second
carries an upstream fix (``upstream_fix``) that wraps the first's
replacement (``registry.plan``). :func:`all_points` therefore puts every
point that carries an upstream fix after every point that does not
(:func:`install_order`), keeping its order otherwise.

That order is by subsystem (``SUBSYSTEMS``' order), then declared order
(``CHANGES``, then each module's ``POINTS``), as it was when points/ had one
module per subsystem. Every replacement is built from torch's original before
any is set, but ``registry.plan`` resolves the points one after another,
importing each target's module, and a point's ``rebinds_if_loaded`` names
only the modules already imported when its turn comes: a point planned
earlier may import one of them (``library.maybe_to_fake_obj.lazy_members``
rebinds ``torch._export.passes.lift_constants_pass`` only because the
``aot_autograd`` fix points before it have imported it, and would otherwise
leave it holding the original: PatchError). So the plan order is kept: the
points before each point with ``rebinds_if_loaded`` are the same as before
the move (test/points/test_point_layout.py pins the order's rule).

Note [Upstream fixes]
~~~~~~~~~~~~~~~~~~~~~
Later upstream fixes for opaque objects in subclasses, carried into the
releases that lack them (``callable_value_opaque``, ``value_opaque_outputs``,
``export_opaque_constants``, ``registered_opaque_instancecheck``,
``lazy_members``, ``lazy_log_and_donated_buffers``; and ``opaque_reads``, a
torch bug with no upstream fix yet).

Native torch 2.12.0 / 2.12.1 / 2.13.0 / 2.14.0 / 2.14.1 support opaque attrs in
``__tensor_flatten__`` but shipped bugs in the feature that upstream fixed
only later. ``install()`` on those releases applies exactly the points
that list the release (mode "native+fixes"); forced mode on 2.13.0 carries
them too, and where the bug is also in the 2.11 backport the point lists
2.11.0 (mode "backport") and the patch series carries the same fix.

Each point is a wrapper that handles the one case the fix is about and
delegates everything else to the function it wraps, so it also stacks on
the 2.11 backport's own replacement of the same function (see
``registry.plan``); the issue 179870 archive writer is the exception, a
short function rewritten whole (its docstring says why). ``upstream_fix`` names the upstream PR; the test that
reproduces the bug on every affected release is in the change's test
module, ``test/points/test_<module>.py``.

Issue 187041 (a value opaque that is subclass metadata and is also stored
through a side effect reaches the side effect as a FakeScriptObject;
2.12.0, 2.12.1, 2.13.0) has no point of its own. Upstream's PR 187057 unwraps the
FakeScriptObject in Dynamo's bytecode codegen. On these releases that
object only exists because AOTAutograd turned the value opaque into a
FakeScriptObject constant next to a subclass output, which the PR 193190
point (``value_opaque_outputs``) prevents; with it applied, a codegen point
receives no FakeScriptObject in any case we could build, so no test would
fail without it, and it is not carried. The issue's test is guarded by the
193190 point.

Three points (``lazy_log_and_donated_buffers``) fix torch 2.10.0 / 2.11.0
bugs *outside* the feature that block parity with native 2.13 for
subclasses written the way users write them (Note [Scope of the fixes
outside the feature] there).
"""

from __future__ import annotations

import importlib

from ..patching.registry import PatchPoint

#: the change modules (Note [One module per change]), in declared order
CHANGES: tuple[str, ...] = (
    # what torch 2.11 has and 2.10 lacks (v2.10.0 series patch 0000)
    "torch_2_11_base",
    "opaque_members",
    # the series, one commit each (0001 ... 0020)
    "subclass_runtime",
    # speed only (no series commit), next to the runtime it speeds up
    "generated_wrappers",
    "functional_utils",
    "tracing",
    "fake_opaque_attrs",
    "dynamo_opaque_inputs",
    "outside_compile",
    "inductor_cache_key",
    "guard_state_pickling",
    "callable_value_opaque",
    "distributed_opaques",
    "dtensor",
    "derived_submesh",
    "lazy_log_and_donated_buffers",
    "no_subclass_data_repr",
    "value_opaque_attrs",
    "fake_process_group_isinstance",
    "tangent_mismatch_message",
    # no series commit: forced mode only
    "forced_validation",
    # upstream fixes of the releases with native support (lazy_members also
    # series 0020), and a torch bug; registered_opaque_instancecheck before
    # lazy_members before opaque_reads (Note [Install order of stacked points])
    "value_opaque_outputs",
    "export_opaque_constants",
    "registered_opaque_instancecheck",
    "lazy_members",
    "opaque_reads",
    "partitioner_deprecated_name",
    "donated_buffers_split",
    "saved_activation_strides",
)

#: the torch subsystems, each with the torch packages its targets live in
#: (the longest matching package decides): a view of the points by target
#: (:func:`subsystem_of`, :func:`by_subsystem`), and the first part of a
#: point's name (Note [One module per change])
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
    """The torch subsystem of a ``"module:attr"`` target (a key of
    ``SUBSYSTEMS``), or None for a package no subsystem names."""
    module = target.partition(":")[0]
    best: tuple[int, str] | None = None
    for name, packages in SUBSYSTEMS.items():
        for package in packages:
            if module == package or module.startswith(package + "."):
                if best is None or len(package) > best[0]:
                    best = (len(package), name)
    return None if best is None else best[1]


def by_subsystem(points: list[PatchPoint]) -> dict[str, list[PatchPoint]]:
    """``points`` grouped by the subsystem of their target, in ``SUBSYSTEMS``
    order (each group in the order given); a target no subsystem names is
    under ``"other"``."""
    groups: dict[str, list[PatchPoint]] = {name: [] for name in SUBSYSTEMS}
    for p in points:
        groups.setdefault(subsystem_of(p.target) or "other", []).append(p)
    return {name: pts for name, pts in groups.items() if pts}


def change_of(point: PatchPoint) -> str:
    """The change module (a member of ``CHANGES``) that declares ``point``."""
    for name in CHANGES:
        if any(p is point for p in importlib.import_module(f"{__name__}.{name}").POINTS):
            return name
    raise LookupError(f"{point.name}: declared by no change module")


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading (test/tools/test_docs.py)."""
    import re

    text = re.sub(r"`([^`]*)`", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def change_table(fixes_md: str | None = None) -> str:
    """The Markdown table of the changes in docs/design.md ("Layout"): for
    each change module, what it is (its docstring's first line), its module,
    the test files of its points' ``guarded_by``, its series commits, the
    upstream fixes it carries and their section in docs/fixes.md (whose text
    is ``fixes_md``; read from the source tree when not given).
    test/points/test_point_layout.py checks that the doc has this table."""
    import re
    from pathlib import Path

    if fixes_md is None:
        path = Path(__file__).resolve().parents[2] / "docs" / "fixes.md"
        fixes_md = path.read_text() if path.exists() else ""
    headings = re.findall(r"^## (.+)$", fixes_md, re.M)
    rows = [
        "| change | module | tests | series | upstream | docs/fixes.md |",
        "|---|---|---|---|---|---|",
    ]
    for name in CHANGES:
        module = importlib.import_module(f"{__name__}.{name}")
        what = (module.__doc__ or "").strip().splitlines()[0].rstrip(".")
        pts = module.POINTS
        tests = dict.fromkeys(t.partition("::")[0] for p in pts for t in p.guarded_by)
        series = sorted({e.split()[0] for p in pts for e in p.series})
        fixes = dict.fromkeys(p.upstream_fix.split(" (")[0] for p in pts if p.upstream_fix)
        links = [
            f"[{fix}](fixes.md#{_slug(h)})"
            for fix in fixes
            for h in headings
            if h == fix or h.startswith(fix + ":")
        ]
        rows.append(
            f"| {what} | `points/{name}.py` | "
            + (", ".join(f"`{t}`" for t in tests) or "-")
            + f" | {', '.join(series) or '-'} | {'; '.join(fixes) or '-'} | "
            + (", ".join(links) or "-")
            + " |"
        )
    return "\n".join(rows) + "\n"


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
    # Every name must import: a misspelled or deleted change module is an
    # error, not a silently smaller install.
    points: list[PatchPoint] = []
    for name in CHANGES:
        points.extend(importlib.import_module(f"{__name__}.{name}").POINTS)
    # Note [Install order of stacked points]: by subsystem, then as declared
    rank = {name: i for i, name in enumerate(SUBSYSTEMS)}
    points.sort(key=lambda p: rank.get(subsystem_of(p.target) or "", len(rank)))
    return install_order(points)
