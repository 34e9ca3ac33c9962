"""Opaque types written with torch 2.14's names register on every release.

Torch 2.14 renamed the registration: ``register_custom_class(cls,
typ="symbolic" | "constant")`` over a ``CustomClassBase``, where 2.11 - 2.13
say ``register_opaque_type(cls, typ="reference" | "value")`` over an
``OpaqueBase`` (2.10 has neither). Code written for 2.14 uses the new names;
the package takes both spellings on every release (``tsrt.register_opaque``
with either ``typ``, ``tsrt.register_custom_class``, ``tsrt.CustomClassBase``)
and registers the type under this torch's own. Each class below is then used
as users use one: a mesh-like handle as an inner attr of a subclass under
``torch.compile`` (one graph for every handle, the runtime handle on the
output), a config compared by value passed to a custom op (one graph per
value).
"""

from __future__ import annotations

import fixtures
import harness

import torch
from torch._dynamo.test_case import TestCase
from torch._dynamo.testing import CompileCounter

import torch_subclass_rt as tsrt

class Group(tsrt.CustomClassBase):
    """A reference type as 2.14 spells it; no ``__repr__``."""


tsrt.register_custom_class(Group, typ="symbolic")


class Precision(tsrt.CustomClassBase):
    """A value type as 2.14 spells it: ``__eq__``, ``__hash__``, ``__fx_repr__``."""

    def __init__(self, bits):
        self.bits = bits

    def __eq__(self, other):
        return isinstance(other, Precision) and other.bits == self.bits

    def __hash__(self):
        return hash(self.bits)

    def __fx_repr__(self):
        return f"Precision({self.bits!r})", {"Precision": Precision}


tsrt.register_opaque(Precision, typ="constant")


@torch.library.custom_op("tsrt_registration_names::round_to", mutates_args=())
def round_to(x: torch.Tensor, p: Precision) -> torch.Tensor:
    scale = 2.0 ** (p.bits - 1)
    return torch.round(x * scale) / scale


@round_to.register_fake
def _(x, p):
    return torch.empty_like(x)


# a wrapper subclass whose group is an inner attr, written as users write
# them (no __repr__, the group passed to the constructor)
Grouped = fixtures.local_and_opaque("Grouped", "group")


class TestRegistrationNames(TestCase):
    def setUp(self):
        super().setUp()
        harness.setup_mode()
        torch._dynamo.reset()

    def tearDown(self):
        torch._dynamo.reset()
        super().tearDown()

    def test_custom_class_base_is_this_torchs_opaque_base(self):
        self.assertIs(tsrt.CustomClassBase, tsrt.OpaqueBase)

    def test_both_spellings_of_a_kind_are_the_same_kind(self):
        from torch._library import opaque_object

        # 2.11 - 2.13 name the kinds reference / value, 2.14 symbolic /
        # constant; 2.10 (no install) has the package's registry only
        if hasattr(opaque_object, "is_opaque_reference_type"):
            self.assertTrue(opaque_object.is_opaque_reference_type(Group))
        if hasattr(opaque_object, "is_opaque_value_type"):
            self.assertTrue(opaque_object.is_opaque_value_type(Precision))

    def test_unknown_typ_names_both_spellings(self):
        class Other(tsrt.CustomClassBase):
            pass

        with self.assertRaisesRegex(ValueError, r"Other.*'reference'.*'symbolic'.*'value'.*'constant'"):
            tsrt.register_custom_class(Other, typ="mutable")

    def test_symbolic_type_as_inner_attr(self):
        def f(x, w):
            return torch.mm(x, w).relu() * 2

        counter = CompileCounter()
        compiled = torch.compile(f, backend=counter, fullgraph=True)
        w = torch.randn(3, 3)
        for _ in range(3):
            group = Group()
            local = torch.randn(4, 3)
            out = compiled(Grouped(local, group), w)
            self.assertIsInstance(out, Grouped)
            self.assertIs(out.group, group)  # the runtime object, not the traced one
            self.assertEqual(out.a, f(local, w))
        self.assertEqual(counter.frame_count, 1)

    # a training compile under Dynamo's TestCase (its structured-trace
    # handler) reprs the fake subclass: issue 152183 in plain native
    # (test/points/test_no_subclass_data_repr.py has the bug itself)
    @harness.upstream_bug(
        "issue 152183 (open upstream; PR 185632 makes the repr subclass-safe on main)",
        ("2.10.0", "2.11.0", "2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1"),
        (Exception,), r"GuardOnDataDependentSymNode|Could not guard on data-dependent",
    )
    def test_symbolic_type_as_inner_attr_backward(self):
        def f(x, w):
            return torch.mm(x, w).sin()

        compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
        grads = []
        for fn in (f, compiled):  # eager is the reference
            group = Group()
            torch.manual_seed(0)
            local = torch.randn(4, 3, requires_grad=True)
            w = torch.randn(3, 3, requires_grad=True)
            out = fn(Grouped(local, group), w)
            self.assertIs(out.group, group)
            out.backward(Grouped(torch.ones(4, 3), group))
            grads.append((out.a.detach(), local.grad, w.grad))
        self.assertEqual(grads[1], grads[0])

    def test_constant_type_in_a_custom_op(self):
        def f(x, p):
            return round_to(torch.mm(x, x), p) + 1

        x = torch.randn(3, 3)
        for backend in ("eager", "aot_eager"):
            torch._dynamo.reset()
            counter = CompileCounter()
            compiled = torch.compile(f, backend=counter if backend == "eager" else backend, fullgraph=True)
            for bits in (2, 2, 4):
                self.assertEqual(compiled(x, Precision(bits)), f(x, Precision(bits)), msg=backend)
            if backend == "eager":
                # compared by value: an equal precision reuses the graph
                self.assertEqual(counter.frame_count, 2)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
