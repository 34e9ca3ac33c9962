"""_torch_compat's opaque predicate, the one the runtime and every point use."""

from __future__ import annotations

import unittest

import harness

import torch
from torch._dynamo.test_case import TestCase, run_tests
from torch._library.fake_class_registry import maybe_to_fake_obj
from torch._subclasses.fake_tensor import FakeTensorMode

from torch_subclass_rt import _torch_compat as compat
from torch_subclass_rt.examples.mesh_tensor import MeshHandle, MeshTensor

MODE = harness.current_mode()


class TestIsOpaqueAttr(TestCase):
    def test_kinds(self):
        h = MeshHandle()
        with FakeTensorMode() as mode:
            fake = maybe_to_fake_obj(mode, h)
        self.assertIsNot(fake, h)
        self.assertIs(compat.unwrap_fake_opaque(fake), h)
        t = torch.zeros(2)
        cases = {
            # value: (fake=None, fake=False, fake=True)
            "handle": (h, (True, True, False)),
            "fake handle": (fake, (True, False, True)),
            "tensor": (t, (False, False, False)),
            "subclass": (MeshTensor(t, h), (False, False, False)),
            "object": (object(), (False, False, False)),
            "None": (None, (False, False, False)),
        }
        for name, (value, expected) in cases.items():
            got = tuple(compat.is_opaque_attr(value, fake=f) for f in (None, False, True))
            self.assertEqual(got, expected, name)

    def test_points_share_the_predicate(self):
        # the edited torch sources import it from _dynamo_opaque by name
        from torch_subclass_rt.points import _dynamo_opaque, dynamo_opaque_inputs as dynamo

        self.assertIs(_dynamo_opaque.is_opaque_attr, compat.is_opaque_attr)
        self.assertIs(dynamo.is_opaque_attr, compat.is_opaque_attr)


class TestOpaqueBaseOn210(TestCase):
    """torch 2.10 has no torch._opaque_base: tsrt.OpaqueBase is ours there
    (Note [OpaqueBase on torch 2.10]); its instance check is testable on
    any torch, the registration rules only on 2.10."""

    def test_instance_check_sees_through_the_fake(self):
        from torch._library.fake_class_registry import FakeScriptObject

        from torch_subclass_rt._opaque_base import OpaqueBase

        class Handle(OpaqueBase):
            pass

        h = Handle()
        self.assertIsInstance(h, OpaqueBase)
        self.assertIsInstance(FakeScriptObject(object(), "Handle", h), Handle)
        # 2.10's own maybe_to_fake_obj makes fakes without a real object
        self.assertNotIsInstance(FakeScriptObject(object(), "Handle", None), Handle)
        self.assertNotIsInstance(FakeScriptObject(object(), "x", object()), OpaqueBase)
        self.assertNotIsInstance(object(), OpaqueBase)

    def test_base_is_this_torchs(self):
        import torch_subclass_rt as tsrt
        from torch_subclass_rt import _opaque_base

        ours = harness.torch_major_minor() == (2, 10)
        self.assertEqual(tsrt.OpaqueBase is _opaque_base.OpaqueBase, ours)
        # torch 2.10 has them while install() is active (points/_opaque_members.py)
        self.assertEqual(compat.has_opaque_members(), not ours or MODE == "backport")

    @unittest.skipUnless(harness.torch_major_minor() == (2, 10), "torch 2.10's registration")
    def test_registration_on_210(self):
        import torch_subclass_rt as tsrt

        class NotOpaqueBase:
            pass

        with self.assertRaisesRegex(TypeError, r"must subclass torch_subclass_rt.OpaqueBase.*class NotOpaqueBase\(tsrt.OpaqueBase\)"):
            tsrt.register_opaque(NotOpaqueBase, typ="reference")

        class WithMembers(tsrt.OpaqueBase):
            start = 0

        guard_fn = lambda o: [o.start]  # noqa: E731
        tsrt.uninstall()
        try:
            with self.assertRaisesRegex(
                TypeError, r"cannot take guard_fn, members before torch_subclass_rt.install\(\).*Call tsrt.install\(\) first"
            ):
                tsrt.register_opaque(WithMembers, typ="reference", guard_fn=guard_fn, members={})
            self.assertFalse(compat.is_registered_opaque_type(WithMembers))
        finally:
            harness.setup_mode()
        # with install(): torch 2.11's members and guard_fn
        from torch._library.opaque_object import MemberType, get_member_type, get_opaque_obj_info

        tsrt.register_opaque(
            WithMembers, typ="reference", guard_fn=guard_fn, members={"start": MemberType.USE_REAL}
        )
        self.assertTrue(compat.is_reference_opaque_type(WithMembers))
        self.assertIs(get_opaque_obj_info(WithMembers).guard_fn, guard_fn)
        self.assertIs(get_member_type(WithMembers, "start"), MemberType.USE_REAL)
        self.assertIsNone(get_member_type(WithMembers, "other"))
        obj = WithMembers()
        obj.start = 7
        with FakeTensorMode() as mode:
            fake = maybe_to_fake_obj(mode, obj)
        # install() gave 2.10's maybe_to_fake_obj 2.11's real_obj
        # (library.maybe_to_fake_obj); without it the fake is of
        # nothing. The fake carries the registered member, read off obj
        # when it is first read (PR 193452, points/_lazy_members.py).
        self.assertTrue(compat.is_opaque_attr(fake))
        self.assertEqual(fake.start, 7)

    @unittest.skipUnless(harness.torch_major_minor() == (2, 10) and MODE == "backport", "torch 2.10 with install()")
    def test_member_registration_errors_on_210(self):
        import torch_subclass_rt as tsrt
        from torch._library.opaque_object import MemberType

        class Value(tsrt.OpaqueBase):
            def __eq__(self, other):
                return isinstance(other, Value)

            def __hash__(self):
                return 0

            def __repr__(self):
                return "Value()"

        with self.assertRaisesRegex(TypeError, r"No need to specify `guard_fn` for value-type opaque class"):
            tsrt.register_opaque(Value, typ="value", guard_fn=lambda o: [])
        self.assertFalse(compat.is_registered_opaque_type(Value))

        class Kinds(tsrt.OpaqueBase):
            pass

        with self.assertRaisesRegex(TypeError, r"members=\{'size': 'USE_REAL'\}.*MemberType.USE_REAL or MemberType.INLINED"):
            tsrt.register_opaque(Kinds, typ="reference", members={"size": "USE_REAL"})

        class Lacking(tsrt.OpaqueBase):
            pass

        tsrt.register_opaque(Lacking, typ="reference", members={"size": MemberType.USE_REAL})
        with FakeTensorMode() as mode, self.assertRaisesRegex(
            TypeError, r"Opaque object of type '[\w.<>]*Lacking' was specified to have member 'size', but this doesn't actually exist"
        ):
            maybe_to_fake_obj(mode, Lacking())


if __name__ == "__main__":
    run_tests()
