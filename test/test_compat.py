"""_torch_compat's opaque predicate, the one the runtime and every point use."""

from __future__ import annotations

import harness

MODE = harness.setup_mode()

import torch  # noqa: E402
from torch._dynamo.test_case import TestCase, run_tests  # noqa: E402
from torch._library.fake_class_registry import maybe_to_fake_obj  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from torch_subclass_rt import _torch_compat as compat  # noqa: E402
from torch_subclass_rt.examples.mesh_tensor import MeshHandle, MeshTensor  # noqa: E402


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
        from torch_subclass_rt.points import _dynamo_opaque, dynamo

        self.assertIs(_dynamo_opaque.is_opaque_attr, compat.is_opaque_attr)
        self.assertIs(dynamo.is_opaque_attr, compat.is_opaque_attr)


if __name__ == "__main__":
    run_tests()
