"""Torch bug: the partitioner calls a deprecated name on every compile.

A torch bug with no upstream issue yet (patches/upstream/ISSUES.md, our
patches/upstream/0005), fixed on the releases that have it (native+fixes).

Releases and modes: 2.14.0, 2.14.1 (native+fixes).
Series commits: none.
Upstream: torch bug: a deprecated name in the partitioner (no upstream
    issue yet; patches/upstream/ISSUES.md).

torch 2.14 renamed the opaque API and made ``is_opaque_value`` log "is
deprecated, use is_custom_class_obj instead" (a ``log.warning``, every
call). Its own partitioner kept calling it
(``torch._functorch.partitioners._iter_input_exprs_without_replacements``,
reached for every saved value or tangent that is an opaque), so a plain
script that compiles a subclass with an opaque attr forward and backward
logs the warning once per such value per compile, with nothing for the
user to change. Upstream's rename (PR 188461) missed this one call site;
torch 2.15.0 still has it.
"""

from __future__ import annotations

from ..patching.registry import PatchPoint
from ._versions import upstream_fix

BROKEN_ON = ("2.14.0", "2.14.1")
FIX = (
    "torch bug: a deprecated name in the partitioner (no upstream issue yet; "
    "patches/upstream/ISSUES.md)"
)


def _build_is_opaque_value(_original):
    """build(): ``torch._functorch.partitioners.is_opaque_value`` (the name
    the partitioner imported; torch 2.14.0 / 2.14.1) becomes the function
    the deprecation names, ``torch._library.opaque_object.is_custom_class_obj``,
    which the deprecated one returns after logging. Same answer, no
    warning; ``torch._library.opaque_object.is_opaque_value`` itself (a
    user's call) is left as torch has it."""
    from torch._library.opaque_object import is_custom_class_obj

    return is_custom_class_obj


POINTS = [
    PatchPoint(
        name="partitioners.is_opaque_value.deprecated_name",
        target="torch._functorch.partitioners:is_opaque_value",
        build=_build_is_opaque_value,
        # a user's own call still gets torch's function and its warning
        keeps_original_in=("torch._library.opaque_object",),
        reason="torch's own partitioner logged 'is_opaque_value is deprecated' for every "
        "opaque saved for backward",
        upstream_fix=FIX,
        series_none="torch 2.10/2.11 have no deprecated opaque names",
        guarded_by=(
            "test/points/test_partitioner_deprecated_name.py::TestPartitionerDeprecatedName::test_compile_logs_no_deprecation",
        ),
        **upstream_fix(*BROKEN_ON),
    ),
]
