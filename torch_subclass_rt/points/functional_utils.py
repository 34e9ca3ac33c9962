"""AOTAutograd's functionalization helpers skip opaque inner attrs.

Series patch 0001 (``functional_utils``) and patch 0007 ("Skip opaque inner
attrs when reading mutations": ``sc_visit``).

Releases and modes: 2.10.0, 2.11.0 (backport).
Series commits:
    patches/v2.10.0/0001-aot_autograd-Opaque-reference-objects-as-inner-attrs.patch,
    patches/v2.10.0/0007-aot_autograd-Skip-opaque-inner-attrs-when-reading-mu.patch.
Upstream: none (not an upstream fix).

AOTAutograd functionalization helpers (``functional_utils``) on 2.10 / 2.11.

The code of the points ``aot_autograd.sc_visit``, ``aot_autograd.is_fun``,
``aot_autograd.sync_functional_tensor`` and
``aot_autograd.are_all_mutations_under_no_grad_or_inference_mode``.

These helpers recurse through ``__tensor_flatten__`` attrs and assume every
attr is a tensor. Each recursive call goes through the module global, so
wrapping the global is enough: the wrapper answers for an opaque with the
value that is neutral for how the caller combines results (``any`` -> False,
``all`` -> True, "nothing to sync" -> no-op) and delegates everything else to
the original. ``is_fun`` combines with *both* any and all (it asserts they
agree), so no neutral value exists; it is replaced by our implementation.

The other helpers need nothing on 2.11: ``has_data_mutation``,
``has_metadata_mutation`` and ``was_inductor_storage_resized`` already answer
False for a non-tensor, ``was_tensor_updated`` / ``was_tensor_metadata_updated``
have no caller, and ``are_all_mutations_hidden_from_autograd`` (False for a
non-tensor, so never True for a subclass with an opaque) only changes what a
training graph does with such a mutation, which 2.11 cannot trace yet
(``graph_capture_wrappers.sc_visit`` reads ``.elem`` off the opaque).
"""

from __future__ import annotations

import functools
from typing import Any

from torch import Tensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .._torch_compat import is_opaque_attr
from ..patching.registry import PatchPoint
from ._versions import ONLY_BACKPORT


def _answer_for_opaques(neutral: Any):
    """build(): wraps ``torch._functorch._aot_autograd.functional_utils.<name>``
    (torch 2.11.0: ``sync_functional_tensor``,
    ``are_all_mutations_under_no_grad_or_inference_mode``) so an opaque
    first argument yields ``neutral``.

    Differs from 2.11: an opaque (reached through the helper's recursion
    into a subclass's attrs) gets the neutral answer instead of 2.11's
    error; 2.12 skips opaque attrs in the same recursion.
    Note [install() is transparent without opaques]: delegation (anything
    but an opaque goes to the original).
    """

    def build(original):
        @functools.wraps(original)
        def wrapper(t, *args, **kwargs):
            if is_opaque_attr(t):
                return neutral
            return original(t, *args, **kwargs)

        return wrapper

    return build


def _build_is_fun(original):
    """build(): replaces ``functional_utils.is_fun`` (torch 2.11.0) by a
    dispatcher: a subclass with an opaque attr goes to our :func:`is_fun`,
    everything else to 2.11's function (see there)."""

    @functools.wraps(original)
    def is_fun_dispatch(t: object) -> bool:
        if isinstance(t, Tensor) and is_traceable_wrapper_subclass(t):
            attrs, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
            if any(is_opaque_attr(getattr(t, a)) for a in attrs):
                return is_fun(t)
        return original(t)

    return is_fun_dispatch


def _fu_is_fun(t: object) -> bool:
    # the installed is_fun (the dispatcher), as torch's recursion would call
    from torch._functorch._aot_autograd import functional_utils

    return functional_utils.is_fun(t)


def is_fun(t: object) -> bool:
    """Replaces ``functional_utils.is_fun`` (torch 2.11.0).

    Differs from 2.11: opaque attrs of a subclass are skipped; the subclass is
    functional iff its tensor attrs are (they must agree), as in torch 2.12.
    Installed behind ``_build_is_fun``. Note [install() is transparent without opaques]:
    delegation (a value without an opaque attr goes to torch's function,
    whose recursion comes back through the module global).
    """
    from torch._subclasses.functional_tensor import FunctionalTensor

    if isinstance(t, Tensor) and is_traceable_wrapper_subclass(t):
        attrs, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
        got: bool | None = None
        for attr in attrs:
            inner = getattr(t, attr)
            if is_opaque_attr(inner):
                continue
            fun = _fu_is_fun(inner)
            if got is None:
                got = fun
            elif got != fun:
                raise AssertionError(
                    f"{type(t).__name__}: mixed functional/non-functional inner tensors"
                )
        return bool(got)
    return isinstance(t, FunctionalTensor)


def sc_visit(t: Any, fn: Any, reduce_fn: Any, accum_init: Any) -> Any:
    """Replaces ``graph_capture_wrappers.sc_visit`` (torch 2.11.0).

    Differs from 2.11: opaque attrs of a subclass are skipped, as in torch
    2.12. Its callers (the mutation/storage counters read while tracing the
    joint graph of a function that mutates a subclass input) apply ``fn`` to
    each leaf's ``.elem``; a FakeScriptObject has none and raised
    ``AttributeError: ... attr 'elem' on a FakeScriptObject``.
    """
    if not is_traceable_wrapper_subclass(t):
        return fn(t)
    accum = accum_init

    def visit(e: Any) -> None:
        nonlocal accum
        if not is_traceable_wrapper_subclass(e):
            accum = reduce_fn(accum, fn(e))
            return
        for attr in e.__tensor_flatten__()[0]:
            inner = getattr(e, attr)
            if is_opaque_attr(inner):
                continue
            visit(inner)

    visit(t)
    return accum


POINTS = [
    PatchPoint(
        name="aot_autograd.sc_visit",
        target="torch._functorch._aot_autograd.graph_capture_wrappers:sc_visit",
        build=lambda _original: sc_visit,
        reason="mutation counters of a mutated subclass input read .elem of an opaque",
        guarded_by=(
            "test/runtime/test_opaque_subclass_parity.py::TestOpaqueSubclassParityCPU"
            "::test_inplace_mutation_of_subclass_input_with_grad_cpu",
        ),
        series=("0007 torch/_functorch/_aot_autograd/graph_capture_wrappers.py::sc_visit",),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="aot_autograd.is_fun",
        target="torch._functorch._aot_autograd.functional_utils:is_fun",
        build=_build_is_fun,
        reason="'mixed functional/non-functional inner tensors' on opaque attrs",
        rebinds=(
            "torch._functorch.aot_autograd",
            "torch._functorch._aot_autograd.graph_capture_wrappers",
        ),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
        ),
        series=("0001 torch/_functorch/_aot_autograd/functional_utils.py::is_fun",),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="aot_autograd.sync_functional_tensor",
        target="torch._functorch._aot_autograd.functional_utils:sync_functional_tensor",
        build=_answer_for_opaques(None),
        reason="torch._sync() rejects an opaque (joint graph inner_fn)",
        rebinds=(
            "torch._functorch.aot_autograd",
            "torch._functorch._aot_autograd.graph_capture_wrappers",
        ),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::"
            "test_tensor_subclass_with_opaque_attr_backward_cpu",
        ),
        series=("0001 torch/_functorch/_aot_autograd/functional_utils.py::sync_functional_tensor",),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="aot_autograd.are_all_mutations_under_no_grad_or_inference_mode",
        target="torch._functorch._aot_autograd.functional_utils"
        ":are_all_mutations_under_no_grad_or_inference_mode",
        build=_answer_for_opaques(True),
        reason="2.11 asserts a FunctionalTensor (input mutated under no_grad)",
        rebinds=(
            "torch._functorch.aot_autograd",
            "torch._functorch._aot_autograd.collect_metadata_analysis",
            "torch._functorch._aot_autograd.graph_capture_wrappers",
        ),
        guarded_by=("test/points/test_point_guards.py::TestPointGuards::test_input_mutation_under_no_grad",),
        series=(
            "0001 torch/_functorch/_aot_autograd/functional_utils.py"
            "::are_all_mutations_under_no_grad_or_inference_mode",
        ),
        **ONLY_BACKPORT,
    ),
]
