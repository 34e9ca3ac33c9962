"""Runtime tangent processing for the compiled backward.

Before the compiled backward runs, each incoming grad_output is coerced to the
type, flatten context and memory format that were assumed when the backward
was traced, and flattened into the backward's inputs. Opaque attrs are not
differentiable; they keep their flat slot and are passed through untouched.

Replaces ``AOTDispatchAutograd.process_runtime_tangent`` for metadata with
an opaque slot: in forced mode (torch 2.13.0; the point
``aot_autograd.process_runtime_tangent`` dispatches here) and in backport
mode (2.10 / 2.11; ``aot_autograd.process_runtime_tangent.mismatch_message``),
where torch's function already passes a non-tensor attr through as its own
flat leaf but words a mismatch in its older text. Note [install()
is transparent without opaques]: delegation. A tangent whose metadata holds
no ``OpaqueMeta`` anywhere (a plain tensor, or any subclass without
opaques) is handed to torch's own function with the very arguments it got.
Metadata with an opaque slot runs :func:`process_runtime_tangent` below,
whose mismatch error says what native torch says: on 2.12+ torch's own
``_raise_tangent_metadata_error`` with the tangent index, descriptor,
compile id and stack trace the caller passed, on 2.10 / 2.11
:func:`mismatch_message` (test/runtime/test_tangent_errors.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ._torch_names import aot
from .meta import OpaqueMeta


def _coerce_metadata(x: Any, expected_type: Any, expected_meta: Any, runtime_type: Any, runtime_meta: Any) -> Any:
    """torch 2.13's ``maybe_coerce`` (local to ``process_runtime_tangent``):
    ``x`` as is, coerced by ``__coerce_same_metadata_as_tangent__``, or None
    when it cannot be. Same steps and results."""
    if expected_type == runtime_type and expected_meta == runtime_meta:
        return x
    coerce = getattr(x, "__coerce_same_metadata_as_tangent__", None)
    if coerce is None:
        return None
    if expected_type == runtime_type:
        # Subclasses written before the 2-argument form take only the meta.
        return coerce(expected_meta)
    return coerce(expected_meta, expected_type)


def _mismatch(
    expected_type: Any, expected_meta: Any, runtime_type: Any, runtime_meta: Any, x: Any,
    tangent_idx: Any, tangent_desc: Any, compile_id_str: Any, tangent_stack_trace: Any,
) -> Exception:
    from torch._functorch._aot_autograd.runtime_wrappers import AOTDispatchAutograd

    native = getattr(AOTDispatchAutograd, "_raise_tangent_metadata_error", None)
    if native is not None:
        # torch's own helper (2.12+; forced mode runs on 2.13), so the
        # message is native's word for word: index, descriptor, graph and
        # stack trace included.
        return native(
            expected_type, expected_meta, runtime_type, runtime_meta, x,
            tangent_idx, tangent_desc, compile_id_str, tangent_stack_trace,
        )
    return RuntimeError(mismatch_message(expected_type, expected_meta, runtime_type, runtime_meta, x))


#: where torch 2.12+ send a user who called backward() on some outputs only
_GRAPH_BREAKS_URL = (
    "https://docs.pytorch.org/docs/stable/user_guide/torch_compiler/compile/"
    "programming_model.graph_breaks_index.html"
)
_TANGENT_ISSUE_URL = "https://github.com/pytorch/pytorch/issues/172556"


def mismatch_message(
    expected_type: Any, expected_meta: Any, runtime_type: Any, runtime_meta: Any, x: Any
) -> str:
    """The "we guessed its metadata incorrectly" message in torch 2.12+'s
    words (``AOTDispatchAutograd._raise_tangent_metadata_error``), for torch
    2.10 / 2.11, which have an older text that names a dunder the
    coercion no longer calls (``__force_to_same_metadata__``).

    Differs from 2.12+: without the tangent index, descriptor, compile id
    and stack trace, which 2.10 / 2.11's backward prologue does not pass.

    Note [Tangent mismatch in 2.12's words]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    The v2.10.0 / v2.11.0 series' patch 0028 (``_tangent_metadata_error``
    in runtime_wrappers.py) builds the same two texts; keep them in sync
    (test/points/test_tangent_mismatch_message.py runs in backport and
    patched mode alike)."""
    lead = "\nDuring the backward, we encountered a tensor subclass where we guessed its\nmetadata incorrectly.\n"
    plain_for_subclass = (
        expected_type is not None and expected_type is not torch.Tensor and runtime_type is torch.Tensor
    )
    if not plain_for_subclass:
        return (
            f"{lead}Expected: {expected_meta} (type {expected_type}),\n"
            f"got: {runtime_meta} (type {runtime_type}), shape: {x.shape}.\n"
            "Your tensor subclass must implement __coerce_same_metadata_as_tangent__."
        )
    return (
        f"{lead}Expected a {expected_type.__name__} tangent but got a plain Tensor.\n"
        "This happens when a compiled function returns multiple outputs that\n"
        "require gradients, but .backward() is only called on some of them.\n"
        "To fix: call .detach() on forward outputs you don't need gradients for.\n\n"
        "This error is also more likely to occur if your compiled model is suffering\n"
        "from a large number of graph breaks. For more advice on finding and fixing\n"
        f"graph breaks, see:\n{_GRAPH_BREAKS_URL}\n\n"
        f"For more info about this error, see:\n{_TANGENT_ISSUE_URL}"
    )


def process_runtime_tangent(
    x: Any,
    meta: Any,
    tangent_idx: int | None = None,
    tangent_desc: Any = None,
    compile_id_str: str | None = None,
    tangent_stack_trace: str | None = None,
    *,
    recurse: Callable[..., Any] | None = None,
) -> tuple[Any, list[Any]]:
    """Replaces ``AOTDispatchAutograd.process_runtime_tangent`` (torch
    2.13.0, forced mode; installed behind :func:`build`, which sends it only
    metadata with an opaque slot).

    Differs from 2.13: nothing a caller can see. Same steps, results and
    errors (the mismatch error is 2.13's own, built from the extra
    positional arguments of its signature); an opaque slot's object is one
    leaf, as in 2.13. The inner attrs recurse through ``recurse`` (the
    installed dispatcher), so inner metadata without opaques goes to
    torch's function as torch's own recursion would.
    See Note [Opaque attrs in the flat argument list] (``flatten``): a
    tangent's leaves follow the layout the backward graph was traced with.

    Returns ``(coerced tangent, its flat leaves for the backward graph)``.
    """
    names = aot()
    if recurse is None:
        recurse = process_runtime_tangent
    if not isinstance(x, torch.Tensor):
        return x, [x]

    if isinstance(x, torch._subclasses.fake_tensor.FakeTensor):
        if not meta.memory_format:
            raise AssertionError("meta.memory_format must not be None for FakeTensor")
        x = names.coerce_to_expected_memory_format(x, meta.memory_format)
        return x, [x]

    expected_type: Any = torch.Tensor
    expected_meta = None
    if type(meta) is names.SubclassCreationMeta:
        expected_type = meta.original_subclass_type
        expected_meta = meta.meta

    # Inside compiled autograd's AOTDispatcher step plain tensors show up as
    # FunctionalTensors; subclasses still show up as themselves.
    runtime_type = type(x)
    if isinstance(x, torch._subclasses.functional_tensor.FunctionalTensor):
        runtime_type = torch.Tensor

    runtime_meta = None
    runtime_keys: Any = ()
    if is_traceable_wrapper_subclass(x):
        runtime_keys, runtime_meta = x.__tensor_flatten__()

    orig_x = x
    x = _coerce_metadata(x, expected_type, expected_meta, runtime_type, runtime_meta)
    if x is None:
        raise _mismatch(
            expected_type, expected_meta, runtime_type, runtime_meta, orig_x,
            tangent_idx, tangent_desc, compile_id_str, tangent_stack_trace,
        )

    if not meta.memory_format:
        raise AssertionError("meta.memory_format must not be None")
    x = names.coerce_to_expected_memory_format(x, meta.memory_format)

    if not is_traceable_wrapper_subclass(x):
        return x, [x]
    if type(meta) is not names.SubclassCreationMeta:
        raise AssertionError(f"expected SubclassCreationMeta, got {type(meta)}")
    if orig_x is not x:
        runtime_keys = x.__tensor_flatten__()[0]
    if len(meta.attrs) != len(runtime_keys):
        raise AssertionError(
            f"expected len(meta.attrs) == len(runtime_subclass_keys), "
            f"got {len(meta.attrs)} != {len(runtime_keys)}"
        )

    leaves: list[Any] = []
    for attr, attr_meta in meta.attrs.items():
        elem = getattr(x, attr)
        if type(attr_meta) is OpaqueMeta:
            leaves.append(elem)  # one slot, no tangent to coerce
            continue
        new_elem, elem_leaves = recurse(elem, attr_meta)
        if new_elem is not elem:
            setattr(x, attr, new_elem)
        leaves.extend(elem_leaves)
    return x, leaves
