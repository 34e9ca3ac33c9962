"""Every test a patch point names in ``guarded_by`` exists, read statically.

``tools/ablate_points.py`` runs those tests with each point left out (minutes
per point); a renamed or deleted test would only show there. This reads the
test files' syntax instead (nothing is imported or run), for every point of
every torch version and mode: the file, the class (``TestXCPU`` / ``TestXCUDA``
are the device variants of ``TestX``, their methods ``..._cpu`` / ``..._cuda``),
and the method, defined in the class, a base class of the same file, or
assigned in its body.
"""

from __future__ import annotations

import ast
import functools
import unittest
from pathlib import Path

from torch_subclass_rt.points import all_points

ROOT = Path(__file__).resolve().parents[2]
_DEVICES = (("CPU", "_cpu"), ("CUDA", "_cuda"))


@functools.cache
def _classes(path: Path) -> dict[str, ast.ClassDef]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def _members(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in classes and base.id != cls.name:
            names |= _members(classes[base.id], classes)
    return names


def problem_of(node_id: str) -> str | None:
    """Why a ``guarded_by`` node id names no test, or None."""
    parts = node_id.split("::")
    if len(parts) == 2 and "[" in parts[1]:
        # a parametrized module-level pytest function: file::func[ids]
        file, func = parts[0], parts[1].split("[", 1)[0]
        path = ROOT / file
        if not path.is_file():
            return f"no file {file}"
        tree = ast.parse(path.read_text(), filename=str(path))
        if not any(isinstance(n, ast.FunctionDef) and n.name == func for n in tree.body):
            return f"no function {func} in {file}"
        return None
    if len(parts) != 3:
        return "not 'test/<file>.py::<Class>::<method>'"
    file, cls_name, method = parts
    path = ROOT / file
    if not path.is_file():
        return f"no file {file}"
    classes = _classes(path)
    if cls_name not in classes:
        for cls_suffix, method_suffix in _DEVICES:
            generic = cls_name[: -len(cls_suffix)]
            if cls_name.endswith(cls_suffix) and generic in classes:
                if not method.endswith(method_suffix):
                    return f"{cls_name} is a device variant; its methods end in {method_suffix}"
                cls_name, method = generic, method[: -len(method_suffix)]
                break
        else:
            return f"no class {cls_name} in {file}"
    if method not in _members(classes[cls_name], classes):
        return f"{cls_name} in {file} has no {method}"
    return None


class TestGuardedBy(unittest.TestCase):
    def test_every_guarded_by_test_exists(self):
        points = all_points()
        self.assertTrue(any(p.guarded_by for p in points))
        missing = [
            f"{p.name}: {node_id}: {why}"
            for p in points
            for node_id in p.guarded_by
            if (why := problem_of(node_id)) is not None
        ]
        self.assertFalse(
            missing,
            "guarded_by names tests that do not exist (renamed or deleted?):\n"
            + "\n".join(missing),
        )

    def test_problem_of_finds_stale_ids(self):
        # the checker itself, on this very file and on ids that are wrong
        me = "test/points/test_guarded_by.py"
        self.assertIsNone(problem_of(f"{me}::TestGuardedBy::test_every_guarded_by_test_exists"))
        self.assertIn("no file", problem_of("test/test_nope.py::TestGuardedBy::test_x"))
        self.assertIn("no class", problem_of(f"{me}::TestNope::test_x"))
        self.assertIn("has no test_gone", problem_of(f"{me}::TestGuardedBy::test_gone"))
        self.assertIn("not 'test/", problem_of(f"{me}::test_every_guarded_by_test_exists"))
        self.assertIsNone(problem_of("test/distributed/test_dtensor_scenarios.py::test_scenario[mm-aot_eager]"))
        self.assertIn("no function test_gone", problem_of(f"{me}::test_gone[x]"))

    def test_device_variants(self):
        f = "test/runtime/test_opaque_subclass_parity.py"
        generic = "TestOpaqueSubclassParity"
        self.assertIsNone(problem_of(
            f"{f}::{generic}CPU::test_fsdp_sync_module_states_skips_opaque_attrs_cpu"
        ))
        self.assertIsNone(problem_of(
            f"{f}::{generic}CUDA::test_fsdp_sync_module_states_skips_opaque_attrs_cuda"
        ))
        self.assertIn("end in _cpu", problem_of(
            f"{f}::{generic}CPU::test_fsdp_sync_module_states_skips_opaque_attrs"
        ))
        self.assertIn("has no test_gone", problem_of(f"{f}::{generic}CPU::test_gone_cpu"))


if __name__ == "__main__":
    unittest.main()
