"""Registered opaque members are resolved when compiled code reads them
(upstream PR 193452, open; issue 187505 items 3-4;
``torch_subclass_rt/points/lazy_members.py``).

Every release with opaque members reads every registered member off the
real object each time it fakifies the object, and binds ``INLINED`` methods
to the real object. Marked :func:`harness.upstream_bug`: in mode ``native``
the releases fail (xfail); with ``install()`` (``native+fixes``, and the
2.10/2.11 backport, which carries the fix too) or the patch series (0020,
``patched``) they pass.
"""

from __future__ import annotations

import harness

import torch
from torch._dynamo.test_case import TestCase
from torch.utils._pytree import tree_map_only

import torch_subclass_rt as tsrt

MODE = harness.current_mode()

#: every release with opaque members has the eager loop; the native ones
#: (where mode "native" runs them as shipped) are listed. The 2.10/2.11
#: backport carries the fix (and the series, patch 0020)
_BROKEN_ON = ("2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1")
_FIX = "PR 193452 (open; issue 187505 items 3-4)"


class Probe(tsrt.OpaqueBase):
    """A reference opaque whose registered property counts its evaluations."""

    evaluations = 0

    def __init__(self, k: int) -> None:
        self.k = k

    @property
    def costly(self) -> int:
        # stands for DeviceMesh-like members that compute (or communicate)
        type(self).evaluations += 1
        return self.k * 10

    def get_k(self) -> int:
        return self.k


class Accumulator(tsrt.OpaqueBase):
    """A reference opaque with an INLINED method that calls a custom op on
    itself: the op's side effect must reach the object passed at run time."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.hits = 0

    def __repr__(self) -> str:
        return f"Accumulator({self.name!r})"

    def record(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.tsrt_lazy.record(self, x)


tsrt.register_opaque(
    Probe, typ="reference", **harness.member_kwargs(costly="USE_REAL", get_k="USE_REAL")
)
tsrt.register_opaque(Accumulator, typ="reference", **harness.member_kwargs(record="INLINED"))


@torch.library.custom_op("tsrt_lazy::record", mutates_args=())
def record(acc: Accumulator, x: torch.Tensor) -> torch.Tensor:
    acc.hits += 1
    return x + 1


@record.register_fake
def _(acc, x):
    return torch.empty_like(x)


class WithOpaque(torch.Tensor):
    """A wrapper subclass with a reference opaque among its inner attrs;
    ``use`` says what its dispatch does with the opaque after ``sin``."""

    @staticmethod
    def __new__(cls, a, obj, use=""):
        return torch.Tensor._make_wrapper_subclass(
            cls, a.shape, dtype=a.dtype, device=a.device, requires_grad=a.requires_grad
        )

    def __init__(self, a, obj, use=""):
        self.a = a
        self.obj = obj
        self.use = use

    def __repr__(self):
        return f"WithOpaque({self.use})"

    def __tensor_flatten__(self):
        return ["a", "obj"], self.use

    @staticmethod
    def __tensor_unflatten__(inner, use, outer_size, outer_stride):
        return WithOpaque(inner["a"], inner["obj"], use)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        first = next(a for a in args if isinstance(a, WithOpaque))
        unwrap = lambda t: t.a  # noqa: E731
        out = func(*tree_map_only(WithOpaque, unwrap, args), **tree_map_only(WithOpaque, unwrap, kwargs or {}))
        if func is torch.ops.aten.sin.default:
            if first.use == "costly":
                out = out * first.obj.costly
            elif first.use == "record":
                out = first.obj.record(out)
        return tree_map_only(torch.Tensor, lambda t: WithOpaque(t, first.obj, first.use), out)


def _sin2(x):
    return (x * 2).sin()


def _plus_k(x, p):
    return x.sin() + p.get_k()


@harness.needs_opaque_members
class TestLazyMembers(TestCase):
    def setUp(self):
        super().setUp()
        torch._dynamo.reset()
        Probe.evaluations = 0

    @harness.upstream_bug(
        _FIX, broken_on=_BROKEN_ON, fails_with=(AssertionError,), match="unread member evaluated"
    )
    def test_unread_member_not_evaluated(self):
        # Nothing compiled reads ``costly``: it must not run. The releases
        # evaluate it at every fakification (2.13.0: twice for the graph
        # input, four times for the inner attr, six with a backward).
        x = torch.randn(3)
        out = torch.compile(_plus_k, backend="aot_eager", fullgraph=True)(x, Probe(2))
        self.assertEqual(out, x.sin() + 2)
        self.assertEqual(Probe.evaluations, 0, "graph input: unread member evaluated")

        a = torch.randn(3, requires_grad=True)
        out = torch.compile(_sin2, backend="aot_eager", fullgraph=True)(WithOpaque(a, Probe(2)))
        out.sum().backward()
        self.assertEqual(out.a, (a * 2).sin())
        self.assertEqual(Probe.evaluations, 0, "inner attr: unread member evaluated")

    def test_member_read_by_dispatch(self):
        # What compiled code does read is resolved off the real object (on
        # the first read of each fake) and gives the eager result.
        a = torch.randn(3)
        expected = _sin2(WithOpaque(a, Probe(3), "costly")).a
        evaluations = Probe.evaluations
        out = torch.compile(_sin2, backend="aot_eager", fullgraph=True)(WithOpaque(a, Probe(3), "costly"))
        self.assertEqual(out.a, expected)
        self.assertEqual(expected, (a * 2).sin() * 30)
        self.assertGreater(Probe.evaluations, evaluations)

    @harness.upstream_bug(
        _FIX, broken_on=_BROKEN_ON, fails_with=(AssertionError,),
        match="the hit went to the traced-with object",
    )
    def test_inlined_member_side_effect_on_runtime_object(self):
        # The subclass's dispatch calls the INLINED ``record`` on its inner
        # attr, which calls a custom op on ``self`` (its side effect: a hit
        # on that object). Bound to the real object while AOTAutograd
        # traces, the op receives the traced-with object, which the graph
        # keeps as a constant: the second call's hit lands on ``first``.
        first, second = Accumulator("first"), Accumulator("second")
        f = torch.compile(_sin2, backend="aot_eager", fullgraph=True)
        x = torch.randn(3)
        out = f(WithOpaque(x, first, "record"))
        self.assertEqual(out.a, (x * 2).sin() + 1)
        self.assertEqual((first.hits, second.hits), (1, 0))
        f(WithOpaque(x, second, "record"))
        self.assertEqual((first.hits, second.hits), (1, 1), "the hit went to the traced-with object")

    def test_registered_member_missing(self):
        # still refused when the fake is made (statically: nothing evaluated)
        class Missing(tsrt.OpaqueBase):
            pass

        tsrt.register_opaque(Missing, typ="reference", **harness.member_kwargs(nope="USE_REAL"))
        f = torch.compile(_sin2, backend="aot_eager", fullgraph=True)
        with self.assertRaisesRegex(Exception, r"TypeError: .*Missing.* member 'nope'"):
            f(WithOpaque(torch.randn(2), Missing()))


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
