"""Fakeify and guard subclasses with opaque attrs.

Series patch 0002 ("Fakeify and guard subclasses with opaque attrs").
torch 2.11 assumes every ``__tensor_flatten__`` attr is a tensor when it
describes a real subclass (``MetaTensorDescriber.describe_tensor``), rebuilds
it as a fake one (``MetaConverter.meta_tensor``), asks whether a subclass
is fake / which fake mode it belongs to (``is_fake``, ``maybe_get_fake_mode``)
and guards its inner sizes (``ShapeEnv.produce_guards_verbose``: opaque
attrs have no sizes and no symbolic context, so 2.11's lookup raised
``KeyError``). torch 2.12 (PR 176457) skips opaque attrs in all of them and
passes the real opaque object through to ``__tensor_unflatten__``; these
points port that.

Releases and modes: 2.10.0, 2.11.0 (backport).
Series commits:
    patches/v2.10.0/0002-fake_tensor-Fakeify-and-guard-subclasses-with-opaque.patch.
Upstream: none (not an upstream fix).

Opaque attrs of a subclass, carried from ``describe_tensor`` to ``meta_tensor``.

torch 2.12 added a field ``MetaTensorDesc.opaque_attrs``. Adding a field to
2.11's frozen dataclass from outside would mean rebuilding the class (every
``isinstance`` and annotation in torch refers to the old one), so instead the
edited ``describe_tensor`` stores the opaques in the *instance* ``__dict__`` of
the desc it built (``object.__setattr__`` bypasses the frozen check; the
dataclass fields, ``__eq__``, ``as_json`` and ``dataclasses.replace`` never see
it), and the edited ``meta_tensor`` reads them back. A desc carries its own
opaques, so nothing is shared between threads and nothing outlives the desc.

``describe_flatten_attrs``, ``attach`` and ``opaque_attrs_of`` are called
from the edited torch sources of the builds below as ``__tsrt__.<name>``
(``_edit_api``).
"""

from __future__ import annotations

from typing import Any, Optional

from torch import Tensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .._torch_compat import is_opaque_attr, unwrap_fake_opaque
from ..patching import point_state
from ..patching.registry import PatchPoint
from ..patching.source_edit import Edit, edited_function
from ..runtime import errors
from ._versions import ONLY_BACKPORT, per_release



def describe_flatten_attrs(
    describer: Any, t: Any, raw_attrs: list[str], trace: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tensor attr -> MetaTensorDesc, opaque attr -> real opaque object).

    Mirrors torch 2.12's ``describe_tensor``: tensors are described
    recursively, opaques are kept as the real object (a FakeScriptObject is
    unwrapped, so re-fakeifying a fake subclass keeps the identity of the
    object), anything else is the runtime's TypeError naming the attr.
    """
    import torch

    attrs: dict[str, Any] = {}
    opaques: dict[str, Any] = {}
    for attr in raw_attrs:
        inner = getattr(t, attr)
        if isinstance(inner, torch.Tensor):
            attrs[attr] = describer.describe_tensor(inner, trace=trace)
        elif is_opaque_attr(inner):
            opaques[attr] = unwrap_fake_opaque(inner)
        else:
            raise errors.unregistered_object_in_tensor_attrs_error(t, attr, inner)
    return attrs, opaques


def attach(desc: Any, opaques: dict[str, Any]) -> None:
    """Called from the edited ``describe_tensor``: the opaque attrs of the
    subclass ``desc`` describes."""
    if opaques:
        point_state.DESC_OPAQUE_ATTRS.set(desc, opaques)


def opaque_attrs_of(desc: Any) -> dict[str, Any]:
    """The opaque attrs ``describe_tensor`` recorded for ``desc`` (may be empty)."""
    return point_state.DESC_OPAQUE_ATTRS.get(desc) or {}


def _tensor_attrs(x: Any) -> list[Tensor] | None:
    """The flatten attrs of subclass ``x`` that are not opaque objects, or
    None when no attr is an opaque (then torch's function answers)."""
    attrs, _ = type(x).__tensor_flatten__(x)
    out = []
    for attr in attrs:
        inner = getattr(x, attr)
        if is_opaque_attr(inner):
            continue
        out.append(inner)
    return out if len(out) != len(attrs) else None


def _build_is_fake(original):
    def is_fake(x: object) -> bool:
        """Replaces ``torch._subclasses.fake_tensor.is_fake`` (torch 2.11.0).

        Differs from 2.11 only for traceable wrapper subclasses: opaque attrs
        are skipped (as in torch 2.12), the tensor attrs must agree, and a
        subclass without tensor attrs is not fake. Every other case
        (FakeTensor, functional and functorch wrappers) is answered by the
        2.11 function, which recurses through the module global and so comes
        back here for a subclass inside a wrapper.
        Note [install() is transparent without opaques]: delegation for
        everything without an opaque attr (a subclass without one included).
        """
        tensors = _tensor_attrs(x) if is_traceable_wrapper_subclass(x) else None
        if tensors is not None:
            all_fake = all(is_fake(t) for t in tensors)
            any_fake = any(is_fake(t) for t in tensors)
            if all_fake != any_fake:
                raise AssertionError("got mixed fake and real tensors!")
            return any_fake
        return original(x)

    is_fake.__wrapped__ = original  # type: ignore[attr-defined]
    return is_fake


def _build_maybe_get_fake_mode(original):
    def maybe_get_fake_mode(t: object) -> Optional[Any]:
        """Replaces ``torch._subclasses.fake_tensor.maybe_get_fake_mode`` (2.11.0).

        Differs from 2.11 only for traceable wrapper subclasses: opaque attrs
        are skipped (as in torch 2.12); the tensor attrs must all report the
        same mode (2.11's rule); no tensor attrs -> None. Everything else is
        delegated to the 2.11 function.
        Note [install() is transparent without opaques]: delegation for
        everything without an opaque attr (a subclass without one included).
        """
        tensors = _tensor_attrs(t) if is_traceable_wrapper_subclass(t) else None
        if tensors is not None:
            modes = [maybe_get_fake_mode(x) for x in tensors]
            if not modes:
                return None
            m = modes[0]
            if not all(m is x for x in modes):
                raise AssertionError("All fake tensor modes must be the same")
            return m
        return original(t)

    maybe_get_fake_mode.__wrapped__ = original  # type: ignore[attr-defined]
    return maybe_get_fake_mode


def _build_describe_tensor(original):
    """``torch._subclasses.meta_utils.MetaTensorDescriber.describe_tensor``
    (torch 2.11.0) with three edits. Differs from 2.11, as 2.12: only tensor
    attrs are described; opaque attrs are kept aside (2.12:
    ``MetaTensorDesc.opaque_attrs``; here on the desc instance, see
    the module docstring for why not a dataclass field); any other attr is
    the runtime's TypeError. Note [install() is transparent without
    opaques]: identical (torch's own source; without opaques
    describe_flatten_attrs describes every attr as 2.11 did and nothing is
    attached)."""
    return edited_function(
        original,
        [
            Edit(
                """
                attrs = {
                    attr: self.describe_tensor(getattr(t, attr), trace=trace)
                    for attr in raw_attrs
                }
                """,
                """
                attrs, opaque_attrs = __tsrt__.describe_flatten_attrs(self, t, raw_attrs, trace)
                """,
            ),
            Edit("attrs = None\nctx = None", "attrs = None\nopaque_attrs = None\nctx = None"),
            Edit(
                """
                if trace and r.id not in self.traced_tensors:
                """,
                """
                if opaque_attrs:
                    __tsrt__.attach(r, opaque_attrs)
                if trace and r.id not in self.traced_tensors:
                """,
            ),
        ],
    )


def _build_meta_tensor(original):
    """``torch._subclasses.meta_utils.MetaConverter.meta_tensor`` (torch
    2.11.0) with two edits. Differs from 2.11, as 2.12: the real opaque
    objects go to ``__tensor_unflatten__`` next to the fakeified inner
    tensors, and a subclass view's replay maps tensor attrs only.
    Note [install() is transparent without opaques]: identical (torch's own
    source; without opaques nothing is added to inner_tensors and every attr
    has a desc)."""
    return edited_function(
        original,
        [
            # _empty_create_subclass: hand the real opaque objects to
            # __tensor_unflatten__ next to the fakeified inner tensors (2.12).
            Edit(
                """
                return t.type.__tensor_unflatten__(  # type: ignore[attr-defined]
                    inner_tensors, t.ctx, outer_size, outer_stride
                )
                """,
                """
                inner_tensors.update(__tsrt__.opaque_attrs_of(t))
                return t.type.__tensor_unflatten__(  # type: ignore[attr-defined]
                    inner_tensors, t.ctx, outer_size, outer_stride
                )
                """,
            ),
            # view replay of a subclass view: only tensor attrs have a desc
            # (2.12: `if attr in t.attrs`).
            Edit(
                """
                for attr in attrs:
                    real_to_fake_mapping[t.attrs[attr].id] = getattr(fake_t, attr)
                """,
                """
                for attr in attrs:
                    if attr in t.attrs:
                        real_to_fake_mapping[t.attrs[attr].id] = getattr(fake_t, attr)
                """,
            ),
        ],
    )


_IS_FAKE_IMPORTERS = (
    "torch._functorch._aot_autograd.schemas",
    "torch.export.graph_signature",
    "torch.fx.experimental.proxy_tensor",
    "torch._dynamo.utils",
    "torch._dynamo.variables.builder",
    "torch._inductor.cudagraph_utils",  # torch 2.11 only
    "torch.testing._internal.subclasses",
)


def _build_produce_guards_verbose(original):
    """``torch.fx.experimental.symbolic_shapes.ShapeEnv.produce_guards_verbose``
    (torch 2.11.0) with one edit. Differs from 2.11, as 2.12: opaque attrs of
    a subclass input are skipped when guarding inner sizes and strides (they
    have neither, nor a symbolic context). Note [install() is transparent
    without opaques]: identical (torch's own source; without opaques no attr
    is skipped)."""
    return edited_function(
        original,
        [
            Edit(
                """
                for attr in attrs:
                    inner_t = getattr(t, attr)
                    inner_context = context.inner_contexts[attr]
                """,
                """
                for attr in attrs:
                    inner_t = getattr(t, attr)
                    if __tsrt__.is_opaque_attr(inner_t):
                        continue  # no sizes/strides to guard (torch 2.12)
                    inner_context = context.inner_contexts[attr]
                """,
            ),
        ],
    )


POINTS = [
    *per_release(
        name="fake_tensors.is_fake",
        target="torch._subclasses.fake_tensor:is_fake",
        series=("0002 torch/_subclasses/fake_tensor.py::is_fake",),
        build=_build_is_fake,
        reason="'got mixed fake and real tensors!' on a subclass with an opaque attr",
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
        ),
        v2_11=dict(rebinds=_IS_FAKE_IMPORTERS),
        v2_10=dict(
            rebinds=tuple(m for m in _IS_FAKE_IMPORTERS if m != "torch._inductor.cudagraph_utils"),
        ),
    ),
    PatchPoint(
        name="fake_tensors.maybe_get_fake_mode",
        target="torch._subclasses.fake_tensor:maybe_get_fake_mode",
        series=("0002 torch/_subclasses/fake_tensor.py::maybe_get_fake_mode",),
        build=_build_maybe_get_fake_mode,
        reason="'All fake tensor modes must be the same' on a subclass with an opaque attr",
        rebinds=("torch._dynamo.utils", "torch._dynamo.variables.builder"),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="fake_tensors.MetaTensorDescriber.describe_tensor",
        target="torch._subclasses.meta_utils:MetaTensorDescriber.describe_tensor",
        # the series adds MetaTensorDesc.opaque_attrs; without a new field
        # (a dataclass's fields are fixed), the package keeps them in
        # point_state.DESC_OPAQUE_ATTRS
        series=(
            "0002 torch/_subclasses/meta_utils.py::MetaTensorDescriber.describe_tensor",
            "0002 torch/_subclasses/meta_utils.py::MetaTensorDesc",
        ),
        build=_build_describe_tensor,
        reason="describe only tensor attrs; keep opaque attrs on the desc",
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="fake_tensors.MetaConverter.meta_tensor",
        target="torch._subclasses.meta_utils:MetaConverter.meta_tensor",
        series=("0002 torch/_subclasses/meta_utils.py::MetaConverter.meta_tensor",),
        build=_build_meta_tensor,
        reason="pass opaque attrs to __tensor_unflatten__; view replay of tensor attrs only",
        # the opaque attrs it hands on are describe_tensor's
        # (point_state.DESC_OPAQUE_ATTRS)
        requires=("fake_tensors.MetaTensorDescriber.describe_tensor",),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="fx.ShapeEnv.produce_guards_verbose",
        target="torch.fx.experimental.symbolic_shapes:ShapeEnv.produce_guards_verbose",
        build=_build_produce_guards_verbose,
        reason="KeyError on context.inner_contexts[attr] for an opaque attr",
        series=("0002 torch/fx/experimental/symbolic_shapes.py::ShapeEnv.produce_guards_verbose",),
        guarded_by=(
            "test/runtime/test_opaque_subclass_attrs.py::TestOpaqueSubclassAttrsCPU::test_tensor_subclass_with_opaque_attr_backward_cpu",
        ),
        **ONLY_BACKPORT,
    ),
]
