"""A wrapper subclass without a ``__repr__`` compiles while torch's
structured trace is written (issue 152183; Note [Metadata repr without
subclass data] in torch_subclass_rt/points/no_subclass_data_repr.py).

With a handler on the structured-trace log (``TORCH_TRACE``, tlparse; the
handler Dynamo's TestCase attaches, used here), AOTAutograd writes its
forward metadata with ``dataclass_repr``, which reprs the fake subclass
instances it holds; ``Tensor.__repr__`` formats a fake's data and the
compile fails with GuardOnDataDependentSymNode on torch 2.10.0 to 2.14.1.
Marked :func:`harness.upstream_bug`: in plain ``native`` mode on 2.12.0 to
2.14.1 it fails (xfail); ``install()`` (every mode) fixes it.
"""

from __future__ import annotations

import harness

import torch
from torch._dynamo.test_case import TestCase
from torch.utils._pytree import tree_map_only

import torch_subclass_rt as tsrt

BROKEN_ON = ("2.10.0", "2.11.0", "2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1")
FIX = "issue 152183 (open upstream; PR 185632 makes the repr subclass-safe on main)"
MATCH = r"GuardOnDataDependentSymNode|Could not guard on data-dependent"


class Handle(tsrt.OpaqueBase):
    def __init__(self, name: str) -> None:
        self.name = name


tsrt.register_opaque(Handle, typ="reference")


class Wrapped(torch.Tensor):
    """Written as users write them: no ``__repr__``, an opaque inner attr."""

    @staticmethod
    def __new__(cls, a, handle):
        return torch.Tensor._make_wrapper_subclass(
            cls, a.shape, dtype=a.dtype, device=a.device, requires_grad=a.requires_grad
        )

    def __init__(self, a, handle):
        self.a = a
        self.handle = handle

    def __tensor_flatten__(self):
        return ["a", "handle"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, size, stride):
        return Wrapped(inner["a"], inner["handle"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        handle = next(x.handle for x in args if isinstance(x, Wrapped))
        args, kwargs = tree_map_only(Wrapped, lambda x: x.a, (args, kwargs or {}))
        return tree_map_only(torch.Tensor, lambda o: Wrapped(o, handle), func(*args, **kwargs))


class Outer(torch.Tensor):
    """A wrapper whose own ``__repr__`` prints its inner tensor."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, dtype=inner.dtype, device=inner.device,
            requires_grad=inner.requires_grad,
        )

    def __init__(self, inner):
        self.inner = inner

    def __repr__(self):
        return f"Outer({self.inner!r})"

    def __tensor_flatten__(self):
        return ["inner"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, size, stride):
        return Outer(inner["inner"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args, kwargs = tree_map_only(Outer, lambda x: x.inner, (args, kwargs or {}))
        return tree_map_only(torch.Tensor, Outer, func(*args, **kwargs))


class TestNoSubclassDataRepr(TestCase):
    # Dynamo's TestCase puts a handler on the structured-trace log (setUp)

    @harness.upstream_bug(FIX, BROKEN_ON, (Exception,), MATCH)
    def test_inference_with_structured_trace(self):
        x = Wrapped(torch.randn(4, 3), Handle("h"))
        w = torch.randn(3, 5)
        with torch.no_grad():
            out = torch.compile(lambda x, w: (x @ w).sin(), backend="aot_eager", fullgraph=True)(x, w)
        self.assertIs(out.handle, x.handle)
        self.assertEqual(out.a, (x.a @ w).sin())

    @harness.upstream_bug(FIX, BROKEN_ON, (Exception,), MATCH)
    def test_training_with_structured_trace(self):
        a = torch.randn(4, 3, requires_grad=True)
        x = Wrapped(a.detach().clone().requires_grad_(), Handle("h"))
        w = torch.randn(3, 5)
        out = torch.compile(lambda x, w: (x @ w).tanh(), backend="aot_eager", fullgraph=True)(x, w)
        out.sum().backward()
        (a @ w).tanh().sum().backward()
        self.assertEqual(out.a, (a @ w).tanh())
        self.assertEqual(x.grad.a, a.grad)

    @harness.upstream_bug(FIX, BROKEN_ON, (Exception,), MATCH)
    def test_nested_subclass_repr_over_one_without(self):
        # the outer class prints its inner tensor, whose class has no
        # __repr__: printing the outer formats the inner's fake data too
        a = torch.randn(4, 3)
        x = Outer(Wrapped(a.clone().requires_grad_(), Handle("h")))
        out = torch.compile(lambda x: (x.sin() * 2), backend="aot_eager", fullgraph=True)(x)
        self.assertEqual(out.inner.a, a.sin() * 2)

    def test_metadata_repr_describes_only_what_cannot_print(self):
        # the fix describes only what would have formatted its data
        from torch_subclass_rt.points.no_subclass_data_repr import field_repr

        class Named(Wrapped):
            def __repr__(self):
                return "Named!"

        plain = torch.randn(2)
        self.assertEqual(field_repr([Named(plain, Handle("n")), 1]), "[Named!, 1]")
        self.assertEqual(field_repr(Outer(Wrapped(plain, Handle("w")))),
                         "<Outer shape=(2,) dtype=torch.float32 device=cpu>")
        self.assertEqual(field_repr(Wrapped(plain, Handle("w"))),
                         "<Wrapped shape=(2,) dtype=torch.float32 device=cpu>")
        self.assertEqual(field_repr((plain, {"k": 2})), repr((plain, {"k": 2})))


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
