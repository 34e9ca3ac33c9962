"""Dependencies between points (``PatchPoint.requires``) and the state they
share (Note [State between points], torch_subclass_rt/patching/point_state.py).

Static checks of the registry, the side tables' semantics, and install()
refusing a point without the one it requires (in a subprocess: this
process keeps the mode under test).
"""

from __future__ import annotations

import ast
import gc
import os
import subprocess
import sys
import unittest
from pathlib import Path

from torch_subclass_rt import points
from torch_subclass_rt._torch_compat import BACKPORT_VERSIONS, FIXES_VERSIONS, FORCED_VERSIONS
from torch_subclass_rt.patching import point_state, registry

REPO = Path(__file__).resolve().parents[2]
POINTS_DIR = Path(points.__file__).parent


def _by_name() -> dict[str, list[registry.PatchPoint]]:
    out: dict[str, list[registry.PatchPoint]] = {}
    for p in points.all_points():
        out.setdefault(p.name, []).append(p)
    return out


class TestRequires(unittest.TestCase):
    def test_required_points_exist_wherever_their_dependents_apply(self):
        by_name = _by_name()
        for version in sorted({*BACKPORT_VERSIONS, *FIXES_VERSIONS, *FORCED_VERSIONS}):
            for mode in ("backport", "native+fixes", "forced"):
                groups = {p.group for p in points.all_points() if p.group}
                selected = registry.select(points.all_points(), version, mode, groups)
                for point, needed in registry.unmet_requirements(selected):
                    self.fail(f"{point.name} requires {needed}, which torch {version} in mode "
                              f"{mode} does not install")
                for p in selected:
                    for needed in p.requires:
                        self.assertIn(needed, by_name, p.name)
                        for q in selected:
                            if q.name == needed:
                                # an opt-in point may need an ungrouped one, not the reverse
                                self.assertIn(q.group, ("", p.group), (p.name, needed))

    def test_some_points_declare_requires(self):
        declared = {p.name: p.requires for p in points.all_points() if p.requires}
        self.assertEqual(declared["dynamo.VariableBuilder._wrap"], ("dynamo.VariableBuilder.wrap_tensor",))
        self.assertIn("aot_autograd.autograd_cache_key.opaque_reads",
                      declared["aot_autograd.AOTAutogradCache.save.opaque_reads"])

    def test_unmet_and_dependents(self):
        def pt(name, *requires):
            return registry.PatchPoint(
                name=name, target=f"m:{name.replace('.', '_')}", build=lambda o: o,
                versions=frozenset({"2.11.0"}), modes=frozenset({"backport"}), reason="r",
                series_none="test", requires=requires,
            )

        a, b, c, d = pt("x.a"), pt("x.b", "x.a"), pt("x.c", "x.b"), pt("x.d")
        self.assertEqual([(p.name, n) for p, n in registry.unmet_requirements([b, c, d])],
                         [("x.b", "x.a")])
        self.assertEqual(registry.with_dependents(["x.a"], [a, b, c, d]), ["x.a", "x.b", "x.c"])
        self.assertEqual(registry.with_dependents(["x.d"], [a, b, c, d]), ["x.d"])

    def test_ablation_leaves_dependents_out_with_the_point(self):
        sys.path.insert(0, str(REPO))
        try:
            from tools import ablate_points
        finally:
            sys.path.remove(str(REPO))
        all_points = points.all_points()
        selected = registry.select(all_points, "2.11.0", "backport", {"dtensor"})
        units = dict((ex[0], ex) for ex, _ in ablate_points.select_units(
            selected, names=["dynamo.VariableBuilder.wrap_tensor"]))
        self.assertEqual(units["dynamo.VariableBuilder.wrap_tensor"],
                         ("dynamo.VariableBuilder.wrap_tensor", "dynamo.VariableBuilder._wrap"))

    def test_install_refuses_a_point_without_the_one_it_requires(self):
        import torch

        version = torch.__version__.split("+")[0]
        if version not in BACKPORT_VERSIONS:
            self.skipTest("the backport's points (install() in backport mode) declare the pair")
        env = {**os.environ, "TSRT_EXCLUDE_POINTS": "dynamo.VariableBuilder.wrap_tensor",
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        code = ("import torch_subclass_rt as t, torch\n"
                "try:\n    t.install()\nexcept ValueError as e:\n    print('REFUSED', e)\n"
                "print('MODE', t.status().mode)\n")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("REFUSED TSRT_EXCLUDE_POINTS leaves out dynamo.VariableBuilder.wrap_tensor, "
                      "which dynamo.VariableBuilder._wrap requires", out.stdout)
        self.assertIn("MODE off", out.stdout)


class TestPointState(unittest.TestCase):
    def test_tables_name_declared_points_and_readers_require_writers(self):
        by_name = _by_name()
        for table in point_state.TABLES:
            for name in (*table.written_by, *table.read_by):
                self.assertIn(name, by_name, table.what)
            for reader in table.read_by:
                for p in by_name[reader]:
                    for writer in table.written_by:
                        self.assertIn(writer, p.requires, f"{reader} reads {table.what!r}")

    def test_no_point_sets_attributes_on_torch_objects(self):
        # state goes through point_state; `object.__setattr__(x, "_tsrt...")`
        # or `x._tsrt_... = ...` in points/ (module code or edit text) is refused
        found = []
        for path in sorted(POINTS_DIR.glob("*.py")):
            source = path.read_text()
            tree = ast.parse(source)
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign):
                    for t in node.targets:
                        if isinstance(t, ast.Attribute) and t.attr.startswith("_tsrt"):
                            found.append(f"{path.name}:{node.lineno}")
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    if "._tsrt_" in node.value and "= " in node.value:
                        found.append(f"{path.name}:{node.lineno} (edit text)")
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ("__setattr__", "setattr")) or (
                        isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id == "setattr"):
                    # torch's own attributes (a FakeScriptObject's real_obj,
                    # its members) are set as torch sets them; ours are not
                    names = [a for a in node.args[1:2] if isinstance(a, ast.Constant)]
                    if names and str(names[0].value).startswith("_tsrt"):
                        found.append(f"{path.name}:{node.lineno} {ast.unparse(node)[:60]}")
        self.assertEqual(found, [])

    def test_side_table_is_by_identity_and_dies_with_its_object(self):
        from dataclasses import dataclass

        @dataclass(frozen=True)
        class Desc:  # equal and hashed by fields, as MetaTensorDesc
            n: int

        table = point_state.SideTable("test", written_by=(), read_by=())
        a, b = Desc(1), Desc(1)
        table.set(a, "a")
        self.assertEqual(table.get(a), "a")
        self.assertIsNone(table.get(b))  # equal, not the same object
        self.assertEqual(table.setdefault(b, "b"), "b")
        self.assertEqual(table.setdefault(b, "c"), "b")
        self.assertEqual(len(table), 2)
        del a
        gc.collect()
        self.assertEqual(len(table), 1)


if __name__ == "__main__":
    unittest.main()
