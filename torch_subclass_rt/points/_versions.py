"""Version sets the point modules declare themselves for."""

from .._torch_compat import BACKPORT_VERSIONS, FORCED_VERSIONS

BACKPORT = frozenset(BACKPORT_VERSIONS)
FORCED = frozenset(FORCED_VERSIONS)
#: backport-only: torch >= 2.12 already does this natively and the point only
#: exists because 2.11 lacks it.
ONLY_BACKPORT = {"versions": BACKPORT, "modes": frozenset({"backport"})}
#: our runtime replacing torch's: on 2.11 to add the feature, on 2.13 (forced)
#: to prove it is a drop-in equal of the native implementation.
RUNTIME = {"versions": BACKPORT | FORCED, "modes": frozenset({"backport", "forced"})}
#: forced-only: adapts torch >= 2.12's native code to our runtime.
ONLY_FORCED = {"versions": FORCED, "modes": frozenset({"forced"})}
