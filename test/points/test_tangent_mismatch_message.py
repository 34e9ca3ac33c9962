"""The compiled backward's tangent metadata error for a subclass with an
opaque attr says what native torch 2.12+ says, on every release and mode
(points/tangent_mismatch_message.py; series 0028 on v2.10.0 / v2.11.0).

Native torch 2.12 - 2.14 (and forced mode, whose runtime raises torch's own
helper) word it ``_raise_tangent_metadata_error``'s way; torch 2.10 / 2.11
had an older text (``Expected metadata: ...``, and a dunder the coercion no
longer calls), which install() replaces for tangents whose metadata holds an
opaque slot. Each case checks the sentences native prints, in every mode;
the one case without an opaque shows what stays torch's own.
"""

from __future__ import annotations

import harness

import torch
from torch._dynamo.test_case import TestCase
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._pytree import tree_leaves, tree_map_only

import torch_subclass_rt as tsrt
from torch_subclass_rt._modes import Mode

MODE = harness.current_mode()


class Handle(tsrt.OpaqueBase):
    pass


tsrt.register_opaque(Handle, typ="reference")


class Tagged(torch.Tensor):
    """Local data, an opaque handle and a tag in the flatten context; no
    ``__coerce_same_metadata_as_tangent__``. It has a ``__repr__``: under
    Dynamo's TestCase, plain native 2.12 - 2.14 would otherwise fall back
    to eager on issue 152183 (test/points/test_no_subclass_data_repr.py)
    and never reach the backward this file is about."""

    @staticmethod
    def __new__(cls, local, handle, tag):
        return torch.Tensor._make_wrapper_subclass(
            cls, local.shape, strides=local.stride(), dtype=local.dtype,
            device=local.device, requires_grad=local.requires_grad,
        )

    def __init__(self, local, handle, tag):
        self.local = local
        self.handle = handle
        self.tag = tag

    def __repr__(self):
        return f"Tagged({self.local!r}, tag={self.tag})"

    def __tensor_flatten__(self):
        return ["local", "handle"], self.tag

    @staticmethod
    def __tensor_unflatten__(inner, tag, outer_size, outer_stride):
        return Tagged(inner["local"], inner["handle"], tag)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        first = next(a for a in tree_leaves((args, kwargs)) if isinstance(a, Tagged))
        args, kwargs = tree_map_only(Tagged, lambda t: t.local, (args, kwargs or {}))
        out = func(*args, **kwargs)
        return tree_map_only(torch.Tensor, lambda t: Tagged(t, first.handle, first.tag), out)


PLAIN_FOR_SUBCLASS = "Expected a Tagged tangent but got a plain Tensor"
CAUSE = ("This happens when a compiled function returns multiple outputs that\n"
         "require gradients, but .backward() is only called on some of them.\n"
         "To fix: call .detach() on forward outputs you don't need gradients for.")


class TestTangentMismatchMessage(TestCase):
    def setUp(self):
        super().setUp()
        harness.setup_mode()
        torch._dynamo.reset()

    def tearDown(self):
        torch._dynamo.reset()
        super().tearDown()

    def error(self, backward) -> str:
        with self.assertRaises(RuntimeError) as ctx:
            backward()
        msg = str(ctx.exception)
        self.assertIn("we guessed its\nmetadata incorrectly.", msg)
        self.assertNotIn("__force_to_same_metadata__", msg)
        return msg

    def test_plain_tangent_for_a_subclass_with_an_opaque(self):
        x = Tagged(torch.randn(4, 3), Handle(), 0).requires_grad_()
        w = torch.randn(3, 3)
        out = torch.compile(lambda t: torch.mm(t, w).sin(), backend="aot_eager")(x)
        msg = self.error(lambda: out.backward(torch.ones(4, 3)))
        self.assertIn(PLAIN_FOR_SUBCLASS, msg)
        self.assertIn(CAUSE, msg)
        self.assertIn("https://github.com/pytorch/pytorch/issues/172556", msg)

    def test_backward_on_one_of_two_outputs(self):
        # the cause the message names: the other output's tangent is a plain zero
        x = Tagged(torch.randn(4), Handle(), 0).requires_grad_()
        a, b = torch.compile(lambda t: (t.sin(), t.cos()), backend="aot_eager")(x)
        msg = self.error(lambda: a.sum().backward())
        self.assertIn(PLAIN_FOR_SUBCLASS, msg)
        self.assertIn(CAUSE, msg)

    def test_other_flatten_context(self):
        x = Tagged(torch.randn(4), Handle(), 1).requires_grad_()
        out = torch.compile(lambda t: t.cos() + 1, backend="aot_eager")(x)
        msg = self.error(lambda: out.backward(Tagged(torch.ones(4), Handle(), 2)))
        self.assertRegex(msg, r"Expected: 1 \(type <class '[\w.]*Tagged'>\),\n"
                              r"got: 2 \(type <class '[\w.]*Tagged'>\), shape: torch.Size\(\[4\]\).\n"
                              r"Your tensor subclass must implement __coerce_same_metadata_as_tangent__.")

    def test_without_an_opaque_the_text_is_this_torchs(self):
        # Note [install() is transparent without opaques]: a subclass without
        # opaques gets what this torch prints without install()
        x = TwoTensor(torch.randn(4), torch.randn(4)).requires_grad_()
        out = torch.compile(lambda t: t.sin() * 2, backend="aot_eager")(x)
        with self.assertRaises(RuntimeError) as ctx:
            out.backward(torch.ones(4))
        older_text = harness.torch_major_minor() < (2, 12)
        self.assertEqual("Expected metadata:" in str(ctx.exception), older_text, str(ctx.exception))


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
