"""Version sets the point modules declare themselves for."""

from typing import Any

from .._modes import Mode
from ..patching.registry import PatchPoint
from .._torch_compat import BACKPORT_VERSIONS, FORCED_VERSIONS

BACKPORT = frozenset(BACKPORT_VERSIONS)
FORCED = frozenset(FORCED_VERSIONS)
#: backport-only: torch >= 2.12 already does this natively and the point only
#: exists because 2.11 lacks it.
ONLY_BACKPORT = {"versions": BACKPORT, "modes": frozenset({Mode.BACKPORT})}
#: our runtime replacing torch's: on 2.11 to add the feature, on 2.13 (forced)
#: to prove it is a drop-in equal of the native implementation.
RUNTIME = {"versions": BACKPORT | FORCED, "modes": frozenset({Mode.BACKPORT, Mode.FORCED})}
#: forced-only: adapts torch >= 2.12's native code to our runtime.
ONLY_FORCED = {"versions": FORCED, "modes": frozenset({Mode.FORCED})}
#: the backport on torch 2.11 only: what 2.10 cannot take (it builds on
#: torch 2.11 features 2.10 lacks: opaque members, DeviceMesh as an opaque)
#: or takes in its own variant (a point of the same name declared with
#: ONLY_2_10: its source differs)
ONLY_2_11 = {"versions": frozenset({"2.11.0"}), "modes": frozenset({Mode.BACKPORT})}
#: the backport on torch 2.10 only: what torch 2.11 already has
#: (points/torch_2_11_base.py, points/opaque_members.py), or 2.10's
#: variant of an ONLY_2_11 point
ONLY_2_10 = {"versions": frozenset({"2.10.0"}), "modes": frozenset({Mode.BACKPORT})}


def upstream_fix(*versions: str) -> dict:
    """Versions/modes of a point that carries a later upstream fix into the
    listed releases (those that lack it): "native+fixes" on a native release,
    "forced" on a forced one (forced mode stands for the newest release, so it
    carries the fixes too), and "backport" where 2.11.0 is listed."""
    from .._torch_compat import FIXES_VERSIONS

    unknown = set(versions) - set(FIXES_VERSIONS) - BACKPORT
    if unknown:
        raise ValueError(f"upstream_fix: no mode for torch {sorted(unknown)}")
    modes = {Mode.NATIVE_FIXES}
    if set(versions) & FORCED:
        modes.add(Mode.FORCED)
    if set(versions) & BACKPORT:
        modes.add(Mode.BACKPORT)
    return {"versions": frozenset(versions), "modes": frozenset(modes)}


def per_release(*, v2_11: dict, v2_10: dict, **common: Any) -> list[PatchPoint]:
    """One backport point whose 2.10 and 2.11 variants differ (Note [Points
    shared by torch 2.10 and 2.11]): the fields both share, and for each
    release what differs (its ``build``, target, rebinds, series or
    guards). Returns the two points, one
    name, for ``POINTS`` to splice in (``*per_release(...)``)."""
    if not v2_11 or not v2_10:
        raise ValueError(f"{common.get('name')}: per_release without a difference")
    if set(common) & (set(v2_11) | set(v2_10)):
        raise ValueError(f"{common.get('name')}: a field is both shared and per release")
    return [
        PatchPoint(**common, **v2_11, **ONLY_2_11),
        PatchPoint(**common, **v2_10, **ONLY_2_10),
    ]
