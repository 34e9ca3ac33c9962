"""Opaque registration errors say what native torch says, on every release.

A ``guard_fn`` given to a value-type opaque (value types are guarded by
``__eq__``), and a registered member the object does not have (found when
the object is first traced): torch 2.11 - 2.14 word them one way; on 2.10
the errors are install()'s (points/opaque_members.py, the series' patch
0000), worded as 2.11 words them. Every mode, every release: the same
text.
"""

from __future__ import annotations

import fixtures
import harness

import torch
from torch._dynamo.test_case import TestCase

import torch_subclass_rt as tsrt


# written as users write them: no __repr__, the handle an inner attr
Carrier = fixtures.local_and_opaque("Carrier", "handle")


class TestOpaqueRegistrationMessages(TestCase):
    def setUp(self):
        super().setUp()
        harness.setup_mode()
        torch._dynamo.reset()

    def tearDown(self):
        torch._dynamo.reset()
        super().tearDown()

    def test_guard_fn_on_value_type(self):
        class Value(tsrt.OpaqueBase):
            def __eq__(self, other):
                return isinstance(other, Value)

            def __hash__(self):
                return 0

            def __repr__(self):
                return "Value()"

            def __fx_repr__(self):
                return "Value()", {"Value": Value}

        with self.assertRaisesRegex(
            TypeError,
            r"No need to specify `guard_fn` for value-type opaque class .*Value'> "
            r"as it will be guarded based on `__eq__`\.",
        ):
            tsrt.register_opaque(Value, typ="value", guard_fn=lambda o: [])

    def test_registered_member_missing_from_the_object(self):
        from torch._library.opaque_object import MemberType

        class Handle(tsrt.OpaqueBase):
            pass

        tsrt.register_opaque(Handle, typ="reference", members={"missing": MemberType.USE_REAL})
        x = Carrier(torch.ones(2), Handle())
        with self.assertRaisesRegex(
            Exception,
            r"Opaque object of type '[\w.<>]*Handle' was specified to have member "
            r"'missing', but this doesn't actually exist in the object\.",
        ):
            torch.compile(lambda t: t * 2, backend="aot_eager")(x)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
