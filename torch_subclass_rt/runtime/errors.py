"""The user-facing errors of the runtime, worded in one place.

Each function returns the exception (the caller raises it). The ones the
series has too carry the same name there (``torch._library.opaque_object``
in patches/v2.11.0, 0001 and 0012), so either form leads to the other.
The patch series raises the same words from torch's own files (see Note
[The runtime and the patch series are one change] in ``runtime``).
"""

from __future__ import annotations

from typing import Any


def _type_name(obj: Any) -> str:
    t = obj if isinstance(obj, type) else type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def value_opaque_in_tensor_attrs_error(
    real_type: type, subclass: Any, attr: str, exc_type: type[Exception] = RuntimeError
) -> Exception:
    # The first two sentences are upstream's wording (torch >= 2.12), so
    # messages match across versions; the rest says where and what to do.
    sub = type(subclass).__name__
    name = real_type.__name__
    return exc_type(
        f"{name!r} found in tensor attrs of {sub}.__tensor_flatten__(). "
        "Only tensors and reference-type opaques are allowed in tensor attrs. "
        f"{sub}.{attr} is a value-type opaque (compared by __eq__ and baked into "
        "the graph as a constant), so it cannot be a graph input: return it in "
        "the flatten context (the second value of __tensor_flatten__) instead, "
        f"or register {name} with typ='reference' if the compiled code must "
        "take the object at run time."
    )


def not_an_inner_attr_error(
    subclass: Any, attr: str, value: Any, value_exc_type: type[Exception] = RuntimeError
) -> Exception:
    """The error for a flatten attr that is an opaque object but not of a
    registered reference type: a registered value type's, or, for an
    ``OpaqueBase`` subclass never registered, the unregistered object's
    (it is no value type; native torch says "expected Tensor or OpaqueBase")."""
    from .. import _torch_compat as compat

    real_type = type(compat.unwrap_fake_opaque(value))
    if compat.is_registered_opaque_type(real_type):
        return value_opaque_in_tensor_attrs_error(real_type, subclass, attr, value_exc_type)
    return unregistered_object_in_tensor_attrs_error(subclass, attr, value)


class UnregisteredInnerAttrError(TypeError, AssertionError):
    """An inner attr that is neither a Tensor nor a registered opaque.

    A TypeError, as this package has always raised it, and an
    AssertionError, as native torch 2.13 and 2.14 raise it ("expected Tensor
    or OpaqueBase, got <class ...>"): code written against either catches
    it, and Dynamo passes it through unwrapped as it passes native's
    (``convert_frame`` re-raises an AssertionError, and wraps a TypeError in
    InternalTorchDynamoError). The series raises the same class from
    ``torch._library.opaque_object``."""


def unregistered_object_in_tensor_attrs_error(
    subclass: Any, attr: str, value: Any
) -> UnregisteredInnerAttrError:
    # The first clause is native torch 2.13's assertion, word for word, so a
    # search for native's message finds this one; the rest says where and
    # what to do. "OpaqueBase" on every release: this runs on 2.10 / 2.11
    # (backport) and 2.13 (forced), and tsrt.OpaqueBase is the name users
    # write (2.14's native assertion says CustomClassBase, its new name).
    sub = type(subclass).__name__
    return UnregisteredInnerAttrError(
        f"expected Tensor or OpaqueBase, got {type(value)}: "
        f"{sub}.__tensor_flatten__() lists {attr!r} as an inner attr, but "
        f"{sub}.{attr} is a {_type_name(value)}, which is neither a Tensor nor a "
        "registered opaque type. Either return it in the flatten context (the "
        "second value of __tensor_flatten__) instead, or make its class derive "
        "from torch_subclass_rt.OpaqueBase and register it with "
        f"torch_subclass_rt.register_opaque({type(value).__name__}, typ='reference')."
    )


def opaque_slot_mismatch(subclass_type: type | None, attr: str, got: Any) -> AssertionError:
    name = getattr(subclass_type, "__name__", "<subclass>")
    return AssertionError(
        f"rebuilding {name}: flat argument for opaque attr {attr!r} is a "
        f"{_type_name(got)}, expected a registered opaque object; the flat "
        "argument list does not match the subclass metadata (this is a bug in "
        "torch_subclass_rt, please report it with the subclass definition)"
    )


def unregistered_opaque_member_error(real_type: type, member: str, registered: list[str]) -> AttributeError:
    # Raised while tracing, where the opaque is a FakeScriptObject that only
    # carries the members its registration lists (torch >= 2.11).
    name = real_type.__name__
    listed = ", ".join(registered) if registered else "none"
    return AttributeError(
        f"{_type_name(real_type)}.{member} was read while tracing, but {member!r} is "
        f"not a registered member of the opaque type {name} (registered: {listed}). "
        "While torch.compile traces, an opaque object is a FakeScriptObject that "
        "carries only the members its registration lists. Register it, e.g. "
        f"torch_subclass_rt.register_opaque({name}, typ='reference', "
        f"members={{{member!r}: MemberType.USE_REAL, ...}}) "
        "(MemberType from torch._library.opaque_object; USE_REAL reads it off the "
        "real object at compile time and bakes the result into the graph), or "
        "do not read it inside __torch_dispatch__ / fake kernels."
    )


def compiled_autograd_opaque_error(metadata: Any, opaques: Any) -> RuntimeError:
    """Compiled autograd on torch 2.10 met a compiled backward that saved
    opaque objects (its C++ side has no slot for them: torch 2.11 adds it)."""
    from .meta import OpaqueMeta

    subclasses = []

    def visit(meta: Any) -> None:
        attrs = getattr(meta, "attrs", None)
        if attrs is None:
            return
        opaque_attrs = [a for a, m in attrs.items() if isinstance(m, OpaqueMeta)]
        cls = getattr(meta, "original_subclass_type", None) or type(meta.original_subclass)
        if opaque_attrs:
            subclasses.append(f"{cls.__qualname__} (opaque attrs {', '.join(map(repr, opaque_attrs))})")
        for inner in attrs.values():
            visit(inner)

    for meta in getattr(metadata, "subclass_inp_meta", None) or ():
        visit(meta)
    where = "; ".join(dict.fromkeys(subclasses)) or "a subclass input"
    types = ", ".join(sorted({_type_name(o) for o in opaques}))
    return RuntimeError(
        f"compiled autograd cannot run this backward on torch 2.10: the compiled "
        f"forward saved opaque object(s) ({types}) of {where} for it, and torch "
        "2.10's compiled autograd has no slot for opaque objects (torch 2.11 adds "
        "one); without this error the backward would rebuild the grad from the "
        "wrong inputs. Run this backward without compiled autograd (outside "
        "torch._dynamo.compiled_autograd._enable, "
        "torch._dynamo.config.compiled_autograd=False), or use torch >= 2.11."
    )
