"""The compiled backward's "we guessed its metadata incorrectly" error for
tangents of subclass outputs *with* an opaque attr.

Those tangents run our ``process_runtime_tangent`` (runtime/tangents.py) in
backport and forced mode. In forced mode the error must be torch 2.13's own,
word for word: its detailed text names the tangent index, the forward
output, the compiled graph and where the output was created. Each case
runs stock 2.13 first, then installed (``install(force=True)``), in one
process, as test_transparency.py does for subclasses without opaques (one
case without an opaque is here too, for the contrast).
"""

from __future__ import annotations

import unittest

import harness

import torch
from torch._dynamo.test_case import TestCase
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._pytree import tree_leaves, tree_map_only

import torch_subclass_rt as tsrt
from torch_subclass_rt.examples.mesh_tensor import MeshHandle, MeshTensor

MODE = harness.current_mode()


class TaggedMesh(torch.Tensor):
    """A local tensor, an opaque mesh and a tag in the flatten context (an
    int): a tangent with another tag has other metadata. No
    ``__coerce_same_metadata_as_tangent__``, on purpose."""

    @staticmethod
    def __new__(cls, inner, mesh, tag):
        return torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, strides=inner.stride(), dtype=inner.dtype,
            device=inner.device, requires_grad=inner.requires_grad,
        )

    def __init__(self, inner, mesh, tag):
        self.inner = inner
        self.mesh = mesh
        self.tag = tag

    def __repr__(self):
        return f"TaggedMesh({self.inner!r}, {self.mesh!r}, tag={self.tag})"

    def __tensor_flatten__(self):
        return ["inner", "mesh"], self.tag

    @staticmethod
    def __tensor_unflatten__(inner_tensors, tag, outer_size, outer_stride):
        return TaggedMesh(inner_tensors["inner"], inner_tensors["mesh"], tag)

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        first = next(a for a in tree_leaves((args, kwargs)) if isinstance(a, TaggedMesh))
        args, kwargs = tree_map_only(TaggedMesh, lambda t: t.inner, (args, kwargs or {}))
        out = func(*args, **kwargs)
        return tree_map_only(torch.Tensor, lambda t: TaggedMesh(t, first.mesh, first.tag), out)


def plain_tangent_for_opaque_output():
    x = MeshTensor(torch.randn(4, requires_grad=True), MeshHandle())
    out = torch.compile(lambda t: t.sin() * 2, backend="aot_eager")(x)
    out.backward(torch.ones(4))


def second_output_without_backward():
    # backward() on one of two outputs: the other's tangent is a plain zero
    x = MeshTensor(torch.randn(4, requires_grad=True), MeshHandle())
    a, b = torch.compile(lambda t: (t.sin(), t.cos()), backend="aot_eager")(x)
    a.sum().backward()


def other_flatten_context():
    x = TaggedMesh(torch.randn(4), MeshHandle(), 1).requires_grad_()
    out = torch.compile(lambda t: t.cos() + 1, backend="aot_eager")(x)
    out.backward(TaggedMesh(torch.ones(4), MeshHandle(), 2))


def nested_plain_inner_tangent():
    x = TaggedMesh(TwoTensor(torch.randn(4), torch.randn(4)), MeshHandle(), 7).requires_grad_()
    out = torch.compile(lambda t: t * 3, backend="aot_eager")(x)
    out.backward(TaggedMesh(torch.ones(4), MeshHandle(), 7))


def plain_tangent_without_opaque():
    x = TwoTensor(torch.randn(4), torch.randn(4)).requires_grad_()
    out = torch.compile(lambda t: t.sin() * 2, backend="aot_eager")(x)
    out.backward(torch.ones(4))


def outcome(fn):
    torch._dynamo.reset()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the outcome under comparison
        return type(e), str(e)
    return None


class TestTangentMetadataErrors(TestCase):
    def test_every_mode_raises(self):
        for fn in (plain_tangent_for_opaque_output, other_flatten_context):
            got = outcome(fn)
            self.assertIsNotNone(got, fn.__name__)
            self.assertIs(got[0], RuntimeError, fn.__name__)
            self.assertIn("metadata incorrectly", got[1], fn.__name__)


@unittest.skipUnless(MODE == "forced", "compares stock torch 2.13 with install(force=True)")
class TestForcedGivesNativeError(TestCase):
    def assertNativeError(self, fn, *expected):
        tsrt.uninstall()
        try:
            native = outcome(fn)
            self.assertEqual(tsrt.install(force=True).mode, "forced")
            forced = outcome(fn)
        finally:
            harness.restore_mode()
        self.assertIsNotNone(native, "stock torch did not raise")
        for text in expected:
            self.assertIn(text, native[1])
        self.assertIsNotNone(forced, "forced mode did not raise")
        self.assertIs(forced[0], native[0])
        self.assertMultiLineEqual(forced[1], native[1])

    def test_plain_tangent_for_opaque_output(self):
        self.assertNativeError(
            plain_tangent_for_opaque_output,
            "(tangent index: 0)", "forward output at index 0", "compiled graph [",
            "The forward output was created here:",
        )

    def test_second_output_without_backward(self):
        self.assertNativeError(
            second_output_without_backward, "(tangent index: 1)", "forward output at index 1"
        )

    def test_other_flatten_context(self):
        self.assertNativeError(other_flatten_context, "Expected: 1", "got: 2")

    def test_nested_plain_inner_tangent(self):
        self.assertNativeError(nested_plain_inner_tangent, "Expected a TwoTensor tangent")

    def test_plain_tangent_without_opaque(self):
        self.assertNativeError(plain_tangent_without_opaque, "(tangent index: 0)")


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
