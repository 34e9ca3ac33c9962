"""What a user is told when ``__tensor_flatten__`` lists something that
cannot be an inner attr, with install() as without it.

An ``OpaqueBase`` subclass that was never registered is neither a tensor
nor a registered opaque: native torch 2.12 says "'X' found in tensor attrs
... Only tensors and reference-type opaques are allowed", 2.13 and 2.14
"expected Tensor or OpaqueBase, got <class ...>"; the backport called it a
value-type opaque, which it is not. With install() every release raises what
2.13 raises (an AssertionError, "expected Tensor or OpaqueBase, got <class
...>"; also a TypeError, as documented before), and goes on to name the
subclass, the attr and how to register the type.
"""

from __future__ import annotations

import fixtures
import harness

import torch
from torch._dynamo.test_case import TestCase

import torch_subclass_rt as tsrt

MODE = harness.current_mode()


class NeverRegistered(tsrt.OpaqueBase):
    def __init__(self, n):
        self.n = n


# written as users write them: no __repr__, the handle an inner attr
Carrier = fixtures.local_and_opaque("Carrier", "handle")


def _chain(exc: BaseException) -> str:
    parts = []
    while exc is not None:
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


class TestFlattenAttrErrors(TestCase):
    def setUp(self):
        super().setUp()
        harness.setup_mode()

    def test_unregistered_opaque_base_subclass(self):
        f = torch.compile(lambda x: x * 2, backend="aot_eager", fullgraph=True)
        with self.assertRaises(Exception) as ctx:
            f(Carrier(torch.randn(3), NeverRegistered(1)))
        chain = _chain(ctx.exception)
        self.assertNotIn("value-type", chain)
        if MODE in ("native", "native+fixes"):
            # torch 2.12's own wording; 2.13 and 2.14 (which renamed
            # OpaqueBase to CustomClassBase) assert
            self.assertRegex(
                chain,
                r"'NeverRegistered' found in tensor attrs of Carrier.__tensor_flatten__\(\)\. "
                r"Only tensors and reference-type opaques are allowed in tensor attrs\.|"
                r"expected Tensor or (OpaqueBase|CustomClassBase), got <class '[\w.]*NeverRegistered'>",
            )
            return
        # native 2.13's class and first words, then where and what to do
        self.assertIsInstance(ctx.exception, AssertionError)
        self.assertIsInstance(ctx.exception, TypeError)  # as documented before
        self.assertRegex(str(ctx.exception),
                         r"^expected Tensor or (OpaqueBase|CustomClassBase), got "
                         r"<class '[\w.]*NeverRegistered'>: ")
        self.assertRegex(chain, r"Carrier\.handle is a [\w.]*NeverRegistered, which is neither a "
                                r"Tensor nor a registered opaque type")
        self.assertIn("register_opaque(NeverRegistered, typ='reference')", chain)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
