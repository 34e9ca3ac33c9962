"""A CUDA variant checks its CPU variant's graph dumps, checked without a GPU.

Note [One expected dump for CPU and CUDA] (harness.py): ``test/expected/``
holds the ``...CPU.test_x_cpu`` dumps only; the ``...CUDA.test_x_cuda``
variant of the same test reads them, its device spelt as the CPU one. These
tests stand in for a GPU run: a CUDA-named test case dumping a CUDA graph.
"""

from __future__ import annotations

import os
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import harness


def _case(cls_name: str, method: str) -> unittest.TestCase:
    cls = type(cls_name, (unittest.TestCase,), {method: lambda self: None})
    return cls(method)


class TestCudaVariantSharesCpuDumps(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        patcher = mock.patch.object(harness, "EXPECTED_DIR", Path(tmp.name))
        patcher.start()
        self.addCleanup(patcher.stop)
        self.dir = Path(tmp.name)

    def dump(self, test, text, accept=False):
        with mock.patch.dict(os.environ, {"EXPECTTEST_ACCEPT": "1" if accept else ""}):
            harness.assertExpectedGraph(test, text, "aot_fw.0")

    def test_cuda_variant_reads_the_cpu_file(self):
        cpu = _case("TestThingCPU", "test_mul_cpu")
        cuda = _case("TestThingCUDA", "test_mul_cuda")
        self.assertEqual(harness.expected_paths(cuda, "g"), harness.expected_paths(cpu, "g"))
        self.dump(cpu, "x: f32[3] device(type='cpu')\n", accept=True)
        self.assertEqual(
            [p.name for p in self.dir.iterdir()], ["TestThingCPU.test_mul_cpu.aot_fw.0.txt"]
        )
        # the same graph on cuda:0 passes against it; another graph fails
        self.dump(cuda, "x: f32[3] device(type='cuda', index=0)\n")
        with self.assertRaisesRegex(AssertionError, r"differs from \S*TestThingCPU\.test_mul_cpu\.aot_fw\.0\.txt"):
            self.dump(cuda, "x: f32[4] device(type='cuda', index=0)\n")

    def test_cuda_variant_records_nothing_of_its_own(self):
        cuda = _case("TestThingCUDA", "test_mul_cuda")
        self.dump(cuda, "t = torch.ones(3, device='cuda:0')\n", accept=True)
        (only,) = self.dir.iterdir()
        self.assertEqual(only.name, "TestThingCPU.test_mul_cpu.aot_fw.0.txt")
        self.assertEqual(only.read_text(), "t = torch.ones(3, device='cpu')\n")

    def test_cpu_variant_keeps_a_cuda_device_it_dumps(self):
        # only a CUDA variant's own device is rewritten: a CPU test whose
        # graph moves data to cuda keeps saying so
        cpu = _case("TestThingCPU", "test_mul_cpu")
        self.dump(cpu, "y = x.to('cuda:0')\n", accept=True)
        (only,) = self.dir.iterdir()
        self.assertEqual(only.read_text(), "y = x.to('cuda:0')\n")

    def test_other_tests_keep_their_names(self):
        plain = _case("TestGeneratedWrapperSource", "test_flat")
        shared, _ = harness.expected_paths(plain, "source")
        self.assertEqual(shared.name, "TestGeneratedWrapperSource.test_flat.source.txt")

    def test_every_cpu_dump_is_found_by_its_cuda_variant(self):
        # the directory as committed: each device-instantiated dump is a CPU
        # one, and its CUDA variant's path is that very file
        real = Path(harness.__file__).resolve().parent / "expected"
        names = [p.name for p in real.glob("*.txt")]
        self.assertFalse([n for n in names if "CUDA." in n or "_cuda." in n], names)
        cpu_dumps = [n for n in names if n.split(".")[0].endswith("CPU")]
        self.assertTrue(cpu_dumps)
        for name in cpu_dumps:
            cls, method, rest = name.split(".", 2)
            cuda = _case(cls[: -len("CPU")] + "CUDA", method[: -len("_cpu")] + "_cuda")
            shared, _ = harness.expected_paths(cuda, rest[: -len(".txt")])
            self.assertEqual(shared.name, name)


if __name__ == "__main__":
    unittest.main()
