"""Strides of the saved activations of a graph whose tensor subclass input is
mutated: eager is the reference (points/saved_activation_strides.py; series
0025; patches/upstream/0007).

Before compiling the backward, AOTAutograd restrides each saved activation
to the stride the compiled forward returns it with. A subclass input that
requires grad and is mutated makes the forward graph return all of its
flattened attrs ahead of the user outputs, which the inner metadata does not
count: torch 2.10.0 to 2.14.1 take the strides of user outputs for saved
activations, and Inductor's backward rejects the real ones ("expected size
4==4, stride 4==1"). The user output here is transposed, so its stride is
not a saved activation's. In mode ``native`` the releases fail (xfail); with
``install()`` every release gives eager's values.
"""

from __future__ import annotations

import unittest

import harness

import torch
import torch.utils._pytree as pytree
from torch._dynamo.test_case import TestCase
from torch.testing._internal.two_tensor import TwoTensor

import torch_subclass_rt as tsrt
from torch_subclass_rt._modes import Mode
from torch_subclass_rt.points.saved_activation_strides import BROKEN_ON, FIX

MODE = harness.current_mode()

#: Inductor's check of the backward's inputs
WRONG = (AssertionError,)
WRONG_STRIDES = r"expected size \d+==\d+, stride \d+==\d+"

needs_opaque_attrs = unittest.skipIf(
    MODE == Mode.NATIVE and harness.torch_major_minor() < (2, 12),
    "stock torch 2.10 / 2.11 have no opaque inner attrs (install() backports them)",
)


class Scale(tsrt.OpaqueBase):
    """A quantization config a user hands around by reference."""

    def __init__(self, bits):
        self.bits = bits


tsrt.register_opaque(Scale, typ="reference")


class ScaledTensor(torch.Tensor):
    """Data, an elementwise scale and a config: ops run on the data and keep
    the scale and config."""

    @staticmethod
    def __new__(cls, data, scale, cfg):
        return torch.Tensor._make_wrapper_subclass(
            cls, data.shape, strides=data.stride(), dtype=data.dtype, device=data.device,
            requires_grad=data.requires_grad,
        )

    def __init__(self, data, scale, cfg):
        self.data_ = data
        self.scale = scale
        self.cfg = cfg

    def __repr__(self):
        # without one, native torch's metadata log fails first under pytest's
        # log capture (issue 152183: test_no_subclass_data_repr.py)
        return f"ScaledTensor({self.data_!r})"

    def __tensor_flatten__(self):
        return ["data_", "scale", "cfg"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return ScaledTensor(inner["data_"], inner["scale"], inner["cfg"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        first = next(x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, cls))
        out = func(*pytree.tree_map_only(cls, lambda t: t.data_, args),
                   **pytree.tree_map_only(cls, lambda t: t.data_, kwargs))
        if func._schema.is_mutable:
            # in-place: the result is the (mutated) subclass argument
            return args[0]
        return pytree.tree_map_only(
            torch.Tensor, lambda t: cls(t, first.scale, first.cfg), out
        )


def _mutate_then_transposed_mm(x):
    x.mul_(2)
    # the user output is transposed; the saved x and mm are not
    return torch.mm(x, x).sin().t() * 2


class TestSavedActivationStrides(TestCase):
    def setUp(self):
        super().setUp()
        harness.setup_mode()
        torch._dynamo.reset()

    def tearDown(self):
        torch._dynamo.reset()
        super().tearDown()

    def _check_against_eager(self, make_leaf, parts):
        def run(fn):
            torch.manual_seed(0)
            leaf = make_leaf()
            # a non-leaf that requires grad, so that it may be mutated in place
            y = fn(leaf.clone())
            y.sum().backward()
            return parts(y), parts(leaf.grad)

        expected = run(_mutate_then_transposed_mm)
        # donated buffers off: the donated-buffer bug (its own change) is
        # not what this test is about
        with torch._functorch.config.patch(donated_buffer=False):
            actual = run(torch.compile(_mutate_then_transposed_mm, backend="inductor", fullgraph=True))
        for what, e, a in zip(("output", "input's grad"), expected, actual):
            for e_part, a_part in zip(e, a):
                torch.testing.assert_close(a_part, e_part, msg=lambda m: f"{what}: {m}")

    @harness.upstream_bug(FIX, BROKEN_ON, WRONG, WRONG_STRIDES)
    def test_inductor_backward_with_transposed_output(self):
        # No opaque: stock 2.10 / 2.11 compile a TwoTensor too
        self._check_against_eager(
            lambda: TwoTensor(torch.randn(4, 4), torch.randn(4, 4)).requires_grad_(True),
            lambda t: (t.a, t.b),
        )

    @needs_opaque_attrs
    @harness.upstream_bug(FIX, BROKEN_ON, WRONG, WRONG_STRIDES)
    def test_inductor_backward_with_opaque_config(self):
        # three flattened attrs of the mutated input, one an opaque
        self._check_against_eager(
            lambda: ScaledTensor(torch.randn(4, 4), torch.full((4, 4), 0.5), Scale(8)).requires_grad_(True),
            lambda t: (t.data_,),
        )


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
