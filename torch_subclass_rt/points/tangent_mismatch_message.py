"""The tangent metadata error of a subclass with opaque attrs, in torch
2.12's words (2.10 / 2.11).

Series commit 0028 ("[aot_autograd] Word a tangent mismatch of an opaque
subclass as torch 2.12 does").

Releases and modes: 2.10.0, 2.11.0 (backport).
Series commits:
    patches/v2.10.0/0028-aot_autograd-Word-a-tangent-mismatch-of-an-opaque-su.patch,
    patches/v2.11.0/0028-aot_autograd-Word-a-tangent-mismatch-of-an-opaque-su.patch.
Upstream: none needed: torch >= 2.12 words every mismatch so
    (``AOTDispatchAutograd._raise_tangent_metadata_error``).

A compiled backward coerces each grad_output to the type and flatten context
it was traced with; one that cannot be coerced is an error. Torch 2.10 /
2.11 word it "Expected metadata: ..., expected type: ..." and send the user
to ``__force_to_same_metadata__``, a dunder the coercion no longer calls;
the commonest cause, a plain tensor where the subclass was expected
(``backward()`` on one of several outputs), is not named. Native 2.12+
names it ("Expected a W tangent but got a plain Tensor", the cause, the
fix) and the right dunder otherwise. A tangent whose metadata holds an
opaque slot now runs our ``runtime/tangents.py`` (as in forced mode), whose
mismatch is worded as 2.12+ words it, less the tangent index, descriptor
and compile id that 2.10 / 2.11's backward prologue does not pass. Other
tangents are torch's (Note [install() is transparent without opaques]).
"""

from __future__ import annotations

from ..patching.registry import PatchPoint
from ._versions import ONLY_BACKPORT
from .subclass_runtime import build_process_runtime_tangent

POINTS = [
    PatchPoint(
        name="aot_autograd.process_runtime_tangent.mismatch_message",
        target="torch._functorch._aot_autograd.runtime_wrappers"
        ":AOTDispatchAutograd.process_runtime_tangent",
        build=build_process_runtime_tangent,
        reason="a tangent mismatch of a subclass with opaques in 2.12+'s words: the plain "
        "tensor named with its cause and fix, not 2.11's __force_to_same_metadata__ text",
        series=(
            "0028 torch/_functorch/_aot_autograd/runtime_wrappers.py::_holds_opaque_slot",
            "0028 torch/_functorch/_aot_autograd/runtime_wrappers.py::_tangent_metadata_error",
            "0028 torch/_functorch/_aot_autograd/runtime_wrappers.py::_GRAPH_BREAKS_URL",
            "0028 torch/_functorch/_aot_autograd/runtime_wrappers.py"
            "::AOTDispatchAutograd.process_runtime_tangent",
        ),
        guarded_by=(
            "test/points/test_tangent_mismatch_message.py::TestTangentMismatchMessage::test_plain_tangent_for_a_subclass_with_an_opaque",
            "test/points/test_tangent_mismatch_message.py::TestTangentMismatchMessage::test_backward_on_one_of_two_outputs",
            "test/points/test_tangent_mismatch_message.py::TestTangentMismatchMessage::test_other_flatten_context",
        ),
        **ONLY_BACKPORT,
    ),
]
