"""install() is invisible to subclasses that hold no opaque.

Note [install() is transparent without opaques] (torch_subclass_rt/runtime/__init__.py)
promises that a program whose subclasses have no opaque among their inner
attrs behaves exactly as on stock torch once install() ran: same results,
same errors, word for word. Each case here runs one program twice in this
process, first stock (nothing installed), then installed (backport on 2.11,
forced on 2.13), and compares the outcomes: the result, or the exception's
type and full message.

Cases of ours (not upstream's):
* inductor freezing with ``TwoTensor`` parameters: frozen subclass constants
  reach the per-call wrapper as ``None``; torch's loop passes them through,
  the generated wrapper once raised a TypeError;
* ``is_fake`` / ``maybe_get_fake_mode`` on a subclass with no inner attrs,
  and ``is_fun``'s error for mixed functional inner tensors (torch's
  answers and words, not ours);
* a NestedTensor built inside the compiled function (its constructor calls
  ``maybe_mark_dynamic``, which Dynamo skips: a graph break, not an error);
* the outer strides of a dynamic 2-D ``TwoTensor`` output: stock 2.11's
  (wrong) strides, not 2.13's;
* the "we guessed its metadata incorrectly" error of the compiled backward,
  for a plain tangent where a subclass was expected, a subclass tangent with
  a different flatten context, and a nested subclass whose inner tangent is
  plain: torch's text (2.11), torch's detailed text (2.13), never ours.
"""

from __future__ import annotations

import unittest

import fixtures
import harness

import torch
import torch._inductor.config as inductor_config
from torch._dynamo.test_case import TestCase
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._pytree import tree_map_only

MODE = harness.current_mode()


class Tagged(torch.Tensor):
    """A wrapper subclass without opaques whose flatten context carries a tag
    (an int): tangents with another tag have other metadata. No
    ``__coerce_same_metadata_as_tangent__``, on purpose."""

    @staticmethod
    def __new__(cls, inner, tag):
        return torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, strides=inner.stride(), dtype=inner.dtype,
            device=inner.device, requires_grad=inner.requires_grad,
        )

    def __init__(self, inner, tag):
        self.inner = inner
        self.tag = tag

    def __repr__(self):
        return f"Tagged({self.inner!r}, tag={self.tag})"

    def __tensor_flatten__(self):
        return ["inner"], self.tag

    @staticmethod
    def __tensor_unflatten__(inner_tensors, tag, outer_size, outer_stride):
        return Tagged(inner_tensors["inner"], tag)

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        tags = [a.tag for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, Tagged)]
        args, kwargs = tree_map_only(Tagged, lambda t: t.inner, (args, kwargs or {}))
        out = func(*args, **kwargs)
        return tree_map_only(torch.Tensor, lambda t: Tagged(t, tags[0]), out)


def outcome(fn):
    """What ``fn()`` did, comparable across two runs: ("returned", value) or
    ("raised", exception type, full message)."""
    torch._dynamo.reset()
    try:
        return ("returned", fn())
    except Exception as e:  # noqa: BLE001 - the outcome under comparison
        return ("raised", type(e), str(e))


@unittest.skipIf(
    MODE not in ("backport", "forced"),
    f"TSRT_MODE={MODE}: install() patches nothing in this mode, so there is no "
    "installed run to compare with the stock one",
)
class TestInstallIsTransparent(TestCase):
    def stock_and_installed(self, fn):
        return fixtures.stock_and_installed(lambda: outcome(fn))

    def assertSameError(self, fn, expected_text):
        stock, installed = self.stock_and_installed(fn)
        self.assertEqual(stock[0], "raised", f"stock torch did not raise: {stock!r}")
        self.assertIn(expected_text, stock[2])
        self.assertEqual(installed[:2], stock[:2])
        # word for word, so a diff shows where the installed text strays
        self.assertMultiLineEqual(installed[2], stock[2])

    # ------------------------------------------------------------------
    # inductor freezing

    def test_inductor_freezing_subclass_parameters(self):
        class Linearish(torch.nn.Module):
            def __init__(self):
                super().__init__()
                g = torch.Generator().manual_seed(0)
                self.w = torch.nn.Parameter(
                    TwoTensor(torch.randn(3, 3, generator=g), torch.randn(3, 3, generator=g)),
                    requires_grad=False,
                )
                self.b = torch.nn.Parameter(
                    TwoTensor(torch.randn(3, generator=g), torch.randn(3, generator=g)),
                    requires_grad=False,
                )

            def forward(self, x):
                return (x @ self.w + self.b).relu()

        mod = Linearish()
        x = TwoTensor(torch.randn(2, 3), torch.randn(2, 3))
        with torch.no_grad():
            ref = mod(x)

        def run():
            with inductor_config.patch(freezing=True), torch.no_grad():
                out = torch.compile(mod, backend="inductor")(x)
            return type(out), out.a, out.b

        stock, installed = self.stock_and_installed(run)
        self.assertEqual(stock[0], "returned", f"stock torch failed: {stock!r}")
        self.assertEqual(installed[0], "returned", f"installed run failed: {installed!r}")
        self.assertIs(installed[1][0], TwoTensor)
        self.assertEqual(installed[1][1], ref.a)
        self.assertEqual(installed[1][2], ref.b)
        self.assertEqual(installed[1][1:], stock[1][1:])

    # ------------------------------------------------------------------
    # outer strides of a dynamic subclass output

    def test_dynamic_subclass_output_strides(self):
        # Torch 2.11 rebuilds a dynamic subclass output with its symbolic
        # strides read from the slots of its sizes (a 4 x 6 TwoTensor comes
        # back with stride (4, 1)); 2.13 fixed it. Without an opaque,
        # install() must give stock's answer, whichever it is, forward
        # (generated wrapper) and backward (grad rebuild) alike.
        def run():
            torch._dynamo.reset()

            @torch.compile(backend="aot_eager", dynamic=True)
            def f(x):
                return x.sin()

            x = TwoTensor(torch.randn(4, 6), torch.randn(4, 6)).requires_grad_()
            out = f(x)
            out.backward(TwoTensor(torch.ones(4, 6), torch.ones(4, 6)))
            return out.shape, out.stride(), x.grad.stride()

        stock, installed = self.stock_and_installed(run)
        self.assertEqual(stock[0], "returned", f"stock torch failed: {stock!r}")
        self.assertEqual(installed, stock)

    # ------------------------------------------------------------------
    # a NestedTensor built while tracing calls maybe_mark_dynamic

    def test_nested_tensor_built_while_tracing(self):
        # NestedTensor.__init__ calls maybe_mark_dynamic, which calls
        # _apply_func_to_inner_tensors_of_same_dim. Dynamo skips torch's
        # (a graph break, then eager); ours must get the same trace rule,
        # not be inlined (it once failed its assert: a hard error).
        import torch.nn.functional as F

        def run():
            torch._dynamo.reset()
            g = torch.Generator().manual_seed(0)
            nt = torch.nested.nested_tensor(
                [torch.randn(3, 3, 16, generator=g), torch.randn(5, 3, 16, generator=g)],
                layout=torch.jagged,
            )

            @torch.compile(backend="aot_eager")
            def f(nt):
                q = nt.transpose(-3, -2)
                return F.scaled_dot_product_attention(q, q, q).transpose(-3, -2)

            out = f(nt)
            return type(out), [t.clone() for t in out.unbind()]

        stock, installed = self.stock_and_installed(run)
        self.assertEqual(stock[0], "returned", f"stock torch failed: {stock!r}")
        self.assertEqual(installed, stock)

    # ------------------------------------------------------------------
    # tangent metadata errors of the compiled backward

    def test_plain_tangent_for_subclass_output_error(self):
        def run():
            x = TwoTensor(torch.randn(4), torch.randn(4)).requires_grad_()
            out = torch.compile(lambda t: t.sin() * 2, backend="aot_eager")(x)
            out.backward(torch.ones(4))

        self.assertSameError(run, "metadata incorrectly")

    def test_tangent_with_other_flatten_context_error(self):
        def run():
            x = Tagged(torch.randn(4), 1).requires_grad_()
            out = torch.compile(lambda t: t.cos() + 1, backend="aot_eager")(x)
            out.backward(Tagged(torch.ones(4), 2))

        self.assertSameError(run, "metadata incorrectly")

    def test_nested_subclass_plain_inner_tangent_error(self):
        def run():
            x = Tagged(TwoTensor(torch.randn(4), torch.randn(4)), 7).requires_grad_()
            out = torch.compile(lambda t: t * 3, backend="aot_eager")(x)
            out.backward(Tagged(torch.ones(4), 7))

        self.assertSameError(run, "metadata incorrectly")

    def test_matching_tangent_backward(self):
        """The same programs with correct tangents: equal grads."""

        def run():
            x = Tagged(TwoTensor(torch.randn(4), torch.randn(4)), 7).requires_grad_()
            out = torch.compile(lambda t: (t * 3).sin(), backend="aot_eager")(x)
            g = Tagged(TwoTensor(torch.ones(4), torch.full((4,), 2.0)), 7)
            out.backward(g)
            return type(x.grad), x.grad.tag, x.grad.inner.a, x.grad.inner.b

        torch.manual_seed(0)
        stock, installed = self.stock_and_installed(lambda: (torch.manual_seed(0), run())[1])
        self.assertEqual(stock[0], "returned", f"stock torch failed: {stock!r}")
        self.assertEqual(installed, stock)

    # ------------------------------------------------------------------
    # replacements that answer for subclasses: torch's answer without opaques

    def test_fake_queries_on_subclass_without_inner_attrs(self):
        class NoAttrs(torch.Tensor):
            @staticmethod
            def __new__(cls, like):
                return torch.Tensor._make_wrapper_subclass(cls, like.shape, dtype=like.dtype)

            def __tensor_flatten__(self):
                return [], None

            @staticmethod
            def __tensor_unflatten__(inner, ctx, size, stride):
                raise AssertionError("not rebuilt here")

            @classmethod
            def __torch_dispatch__(cls, func, types, args, kwargs=None):
                raise AssertionError("not dispatched here")

        x = NoAttrs(torch.randn(2))

        def run():
            from torch._subclasses import fake_tensor

            answers = []
            for query in (fake_tensor.is_fake, fake_tensor.maybe_get_fake_mode):
                try:
                    answers.append(query(x))
                except Exception as e:  # noqa: BLE001 - part of the answer
                    answers.append((type(e), str(e)))
            return answers

        stock, installed = self.stock_and_installed(run)
        self.assertEqual(installed, stock)

    def test_fake_script_object_of_an_object_that_cannot_be_copied(self):
        # FakeScriptObject deep-copies what it wraps unless it is a registered
        # opaque; a failed copy is torch's business: 2.11 falls back to the
        # object on a TypeError, 2.10 lets it through (RuntimeError only)
        from torch._library.fake_class_registry import FakeScriptObject

        class Uncopyable:
            def __deepcopy__(self, memo):
                raise TypeError("Uncopyable cannot be copied")

        def run():
            fake = FakeScriptObject(object(), "Uncopyable", Uncopyable())
            return type(object.__getattribute__(fake, "real_obj")).__name__

        stock, installed = self.stock_and_installed(run)
        self.assertEqual(installed, stock)

    def test_is_fun_mixed_inner_tensors_error(self):
        from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

        with FunctionalTensorMode():
            functional = FunctionalTensor.to_functional(torch.randn(2))
        x = TwoTensor(functional, torch.randn(2))

        def run():
            from torch._functorch._aot_autograd import functional_utils

            return functional_utils.is_fun(x)

        # torch 2.10's assert has no message (2.11 added it)
        expected = "mixed functional/non-functional inner tensors"
        self.assertSameError(run, expected if harness.torch_major_minor() >= (2, 11) else "")


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
