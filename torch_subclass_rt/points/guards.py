"""Guard building: ``ShapeEnv.produce_guards_verbose`` on subclasses with opaques.

For a subclass input, 2.11 pairs every ``__tensor_flatten__`` attr with its
inner symbolic context (``context.inner_contexts[attr]``) to guard its sizes
and strides. Opaque attrs have no sizes and no symbolic context (Dynamo's
``_automatic_dynamic`` does not create one for them, as in 2.12), so the
lookup raised ``KeyError``. torch 2.12 skips them in that loop; so do we,
with a one-line source edit of the 818-line method.
"""

from __future__ import annotations

from ..patching.registry import PatchPoint
from ..patching.source_edit import Edit, edited_function
from ._versions import ONLY_BACKPORT

_HELPERS = "torch_subclass_rt.points._dynamo_opaque"


def _build_produce_guards_verbose(original):
    # Note [install() is transparent without opaques]: identical (torch's own source;
    # without opaques no attr is skipped).
    return edited_function(
        original,
        [
            Edit(
                """
                for attr in attrs:
                    inner_t = getattr(t, attr)
                    inner_context = context.inner_contexts[attr]
                """,
                f"""
                from {_HELPERS} import is_opaque_attr as _tsrt_is_opaque_attr

                for attr in attrs:
                    inner_t = getattr(t, attr)
                    if _tsrt_is_opaque_attr(inner_t):
                        continue  # no sizes/strides to guard (torch 2.12)
                    inner_context = context.inner_contexts[attr]
                """,
            ),
        ],
    )


POINTS = [
    PatchPoint(
        name="guards.ShapeEnv.produce_guards_verbose",
        target="torch.fx.experimental.symbolic_shapes:ShapeEnv.produce_guards_verbose",
        build=_build_produce_guards_verbose,
        reason="KeyError on context.inner_contexts[attr] for an opaque attr",
        **ONLY_BACKPORT,
    ),
]
