"""Torch 2.14's partitioner calls the deprecated ``is_opaque_value``
(points/partitioner_deprecated_name.py; patches/upstream/0005).

A subclass with an opaque attr compiled forward and backward saves the
opaque for backward; on stock 2.14.0 / 2.14.1 the partitioner then logs
"is_opaque_value is deprecated" for it on every compile. With install()
(native+fixes) it logs nothing; other releases never did.
"""

from __future__ import annotations

import logging

import harness

import torch
from torch._dynamo.test_case import TestCase

from torch_subclass_rt.examples.mesh_tensor import MeshHandle, MeshTensor
from torch_subclass_rt.points.partitioner_deprecated_name import BROKEN_ON, FIX

LOGGED = (AssertionError,)
LOGGED_MATCH = r"is_opaque_value is deprecated"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class TestPartitionerDeprecatedName(TestCase):
    def setUp(self):
        super().setUp()
        harness.setup_mode()

    @harness.upstream_bug(FIX, BROKEN_ON, LOGGED, LOGGED_MATCH)
    def test_compile_logs_no_deprecation(self):
        records = _Records()
        # torch's loggers do not all propagate: listen on the one that logs
        logger = logging.getLogger("torch._library.opaque_object")
        logger.addHandler(records)
        try:
            f = torch.compile(lambda x: (x.sin() * 2).cos(), backend="aot_eager", fullgraph=True)
            local = torch.randn(4)
            x = MeshTensor(local.clone(), MeshHandle("m")).requires_grad_(True)
            out = f(x)
            out.sum().backward()
        finally:
            logger.removeHandler(records)
        self.assertEqual(out._local, (local.sin() * 2).cos())
        self.assertEqual(x.grad._local, -torch.sin(local.sin() * 2) * 2 * local.cos())
        deprecated = [m for m in records.messages if "deprecated" in m]
        if deprecated:
            self.fail("torch logged: " + "; ".join(deprecated))


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
