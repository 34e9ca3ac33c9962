"""AOTAutograd functionalization helpers (``functional_utils``) on 2.11.

These helpers recurse through ``__tensor_flatten__`` attrs and assume every
attr is a tensor. Each recursive call goes through the module global, so
wrapping the global is enough: the wrapper answers for an opaque with the
value that is neutral for how the caller combines results (``any`` -> False,
``all`` -> True, "nothing to sync" -> no-op) and delegates everything else to
the original. ``is_fun`` combines with *both* any and all (it asserts they
agree), so no neutral value exists; it is replaced by our implementation.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import Tensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .._torch_compat import is_opaque_object
from ..patching.registry import PatchPoint
from ._versions import ONLY_BACKPORT

_FU = "torch._functorch._aot_autograd.functional_utils"
_AOT = "torch._functorch._aot_autograd"


def _answer_for_opaques(neutral: Any):
    """build(): wrap ``original`` so an opaque first argument yields ``neutral``.

    Note [install() is transparent without opaques]: delegation (anything but an
    opaque goes to the original).
    """

    def build(original):
        @functools.wraps(original)
        def wrapper(t, *args, **kwargs):
            if not isinstance(t, Tensor) and is_opaque_object(t):
                return neutral
            return original(t, *args, **kwargs)

        return wrapper

    return build


def _build_is_fun(original):
    @functools.wraps(original)
    def is_fun_dispatch(t: object) -> bool:
        if isinstance(t, Tensor) and is_traceable_wrapper_subclass(t):
            attrs, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
            if any(
                not isinstance(v, Tensor) and is_opaque_object(v)
                for v in (getattr(t, a) for a in attrs)
            ):
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
            if not isinstance(inner, Tensor) and is_opaque_object(inner):
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


def _neutral(name: str, neutral: Any, reason: str, rebinds: tuple[str, ...]) -> PatchPoint:
    return PatchPoint(
        name=f"functional.{name}",
        target=f"{_FU}:{name}",
        build=_answer_for_opaques(neutral),
        reason=reason,
        rebinds=rebinds,
        **ONLY_BACKPORT,
    )


_CMA = f"{_AOT}.collect_metadata_analysis"
_GCW = f"{_AOT}.graph_capture_wrappers"
_ROOT = "torch._functorch.aot_autograd"

POINTS = [
    PatchPoint(
        name="functional.is_fun",
        target=f"{_FU}:is_fun",
        build=_build_is_fun,
        reason="'mixed functional/non-functional inner tensors' on opaque attrs",
        rebinds=(_ROOT, _GCW),
        **ONLY_BACKPORT,
    ),
    _neutral(
        "sync_functional_tensor",
        None,
        "torch._sync() rejects an opaque (joint graph inner_fn)",
        (_ROOT, _GCW),
    ),
    _neutral("has_data_mutation", False, "opaques are never mutated data",
             (_ROOT, _CMA, _GCW)),
    _neutral("are_all_mutations_hidden_from_autograd", True, "opaques have no mutations",
             (_ROOT, _CMA, _GCW)),
    _neutral("are_all_mutations_under_no_grad_or_inference_mode", True,
             "opaques have no mutations", (_ROOT, _CMA, _GCW)),
    _neutral("was_inductor_storage_resized", False, "opaques have no storage", (_CMA, _GCW)),
    _neutral("has_metadata_mutation", False, "opaques have no tensor metadata",
             (_ROOT, _CMA, _GCW)),
    _neutral("was_tensor_updated", False, "an opaque slot is not a tensor update", ()),
    _neutral("was_tensor_metadata_updated", False, "opaques have no tensor metadata", ()),
]
