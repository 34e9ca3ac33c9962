"""The package's metadata admits every torch the matrix installs it beside.

The nox sessions install a torch release first and this package after it;
a ``torch`` requirement that excludes the release makes pip replace it with
the newest torch it can find, and the session then tests that one instead
(as happened to the 2.10.0 session while setup.py required torch>=2.11).
"""

from __future__ import annotations

import ast
import re
import unittest
from pathlib import Path

from packaging.requirements import Requirement

from torch_subclass_rt import _torch_compat as compat

ROOT = Path(__file__).resolve().parents[2]


def _install_requires() -> list[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no install_requires")


def _matrix_versions() -> list[str]:
    text = (ROOT / "noxfile.py").read_text()
    m = re.search(r'@nox\.parametrize\("torch", (\[[^\]]*\])\)', text)
    assert m, "noxfile.py has no torch parametrization"
    return ast.literal_eval(m.group(1))


class TestTorchRequirement(unittest.TestCase):
    def _torch_requirement(self) -> Requirement:
        reqs = [Requirement(r) for r in _install_requires()]
        torch_reqs = [r for r in reqs if r.name == "torch"]
        self.assertEqual(len(torch_reqs), 1, reqs)
        return torch_reqs[0]

    def test_admits_every_supported_release(self):
        req = self._torch_requirement()
        for version in (*compat.BACKPORT_VERSIONS, *compat.FORCED_VERSIONS, *compat.FIXES_VERSIONS):
            with self.subTest(torch=version):
                self.assertTrue(
                    req.specifier.contains(version),
                    f"setup.py requires {req}, which excludes supported torch {version}",
                )

    def test_admits_every_matrix_release(self):
        req = self._torch_requirement()
        for version in _matrix_versions():
            with self.subTest(torch=version):
                self.assertTrue(req.specifier.contains(version), f"{req} excludes {version}")


if __name__ == "__main__":
    unittest.main()
