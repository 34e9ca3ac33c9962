"""A value-type opaque's attributes read in compiled code: eager is the
reference (points/value_opaque_attrs.py; series 0026 on v2.11.0).

A value opaque (a config compared by value: ``__eq__``, ``__hash__``)
registered without ``members=``, read as ``c.scale`` in the compiled
function: torch 2.11 + ``install()`` refused it ("Attempted to access
unregistered member on an OpaqueObject") where 2.10 + ``install()`` and
native 2.12 - 2.14 compile it. A changed value recompiles (the guard is the
object's ``__eq__``) and gives eager's values.
"""

from __future__ import annotations

import unittest

import harness

import torch
import torch.utils._pytree as pytree
from torch._dynamo.test_case import TestCase
from torch._dynamo.testing import CompileCounter

import torch_subclass_rt as tsrt
from torch_subclass_rt._modes import Mode

MODE = harness.current_mode()

needs_value_opaques = unittest.skipIf(
    MODE == Mode.NATIVE and harness.torch_major_minor() < (2, 12),
    "stock torch 2.10 / 2.11: install() backports opaques",
)


class Cfg(tsrt.OpaqueBase):
    """A quantization config compared by value, written as a user writes one
    for torch 2.13 (``__fx_repr__``), and with a ``__repr__`` (2.10 asks for
    one)."""

    def __init__(self, scale):
        self.scale = scale

    def __eq__(self, other):
        return isinstance(other, Cfg) and other.scale == self.scale

    def __hash__(self):
        return hash(self.scale)

    def __repr__(self):
        return f"Cfg({self.scale!r})"

    def __fx_repr__(self):
        return f"Cfg({self.scale!r})", {"Cfg": Cfg}


tsrt.register_opaque(Cfg, typ="value")


class Bits(tsrt.OpaqueBase):
    """A value type written for torch 2.13: ``__fx_repr__``, no ``__repr__``."""

    def __init__(self, n):
        self.n = n

    def __eq__(self, other):
        return isinstance(other, Bits) and other.n == self.n

    def __hash__(self):
        return hash(self.n)

    def __fx_repr__(self):
        return f"Bits({self.n!r})", {"Bits": Bits}


_quantize = []


def quantize_op():
    """A custom op taking a ``Bits``, defined once ``Bits`` is registered
    (the registration is what the test checks)."""
    if not _quantize:
        tsrt.register_opaque(Bits, typ="value")

        @torch.library.custom_op("tsrt_value_attrs::quantize", mutates_args=())
        def quantize(x: torch.Tensor, bits: Bits) -> torch.Tensor:
            scale = 2.0 ** (bits.n - 1)
            return torch.round(x * scale) / scale

        @quantize.register_fake
        def _(x, bits):
            return torch.empty_like(x)

        _quantize.append(quantize)
    return _quantize[0]


class Scaled(torch.Tensor):
    """A wrapper subclass with its config in the flatten context."""

    @staticmethod
    def __new__(cls, data, cfg):
        return torch.Tensor._make_wrapper_subclass(
            cls, data.shape, strides=data.stride(), dtype=data.dtype, device=data.device
        )

    def __init__(self, data, cfg):
        self.data_ = data
        self.cfg = cfg

    def __repr__(self):
        return f"Scaled({self.data_!r}, {self.cfg!r})"

    def __tensor_flatten__(self):
        return ["data_"], self.cfg

    @staticmethod
    def __tensor_unflatten__(inner, cfg, outer_size, outer_stride):
        return Scaled(inner["data_"], cfg)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        cfg = next(x.cfg for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, cls))
        out = func(*pytree.tree_map_only(cls, lambda t: t.data_, args),
                   **pytree.tree_map_only(cls, lambda t: t.data_, kwargs or {}))
        return pytree.tree_map_only(torch.Tensor, lambda t: cls(t, cfg), out)


class TestValueOpaqueAttrs(TestCase):
    def setUp(self):
        super().setUp()
        harness.setup_mode()
        torch._dynamo.reset()

    def tearDown(self):
        torch._dynamo.reset()
        super().tearDown()

    @needs_value_opaques
    def test_attr_of_value_opaque_argument(self):
        def f(x, c):
            return torch.mm(x, x) * c.scale

        counter = CompileCounter()
        compiled = torch.compile(f, backend=counter, fullgraph=True)
        x = torch.randn(3, 3)
        for scale in (2.0, 2.0, 0.5):
            self.assertEqual(compiled(x, Cfg(scale)), f(x, Cfg(scale)))
        # an equal config reuses the graph, another one recompiles
        self.assertEqual(counter.frame_count, 2)

    @needs_value_opaques
    def test_value_type_with_fx_repr_only(self):
        # registers on every release (2.10 asked for a __repr__), and the
        # constant is written into the generated code with __fx_repr__
        quantize = quantize_op()

        def f(x, bits):
            return quantize(torch.mm(x, x), bits) + 1

        x = torch.randn(3, 3)
        for backend in ("eager", "aot_eager"):
            torch._dynamo.reset()
            compiled = torch.compile(f, backend=backend, fullgraph=True)
            for n in (2, 4):
                self.assertEqual(compiled(x, Bits(n)), f(x, Bits(n)), msg=backend)

    @needs_value_opaques
    def test_attr_of_value_opaque_in_flatten_context(self):
        def f(x):
            return (x * x.cfg.scale).data_

        for backend in ("eager", "aot_eager"):
            torch._dynamo.reset()
            compiled = torch.compile(f, backend=backend, fullgraph=True)
            data = torch.randn(4)
            for scale in (3.0, 0.25):
                self.assertEqual(compiled(Scaled(data, Cfg(scale))), data * scale, msg=backend)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
