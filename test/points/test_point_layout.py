"""How points/ is organised (Note [One module per torch subsystem],
Note [Install order of stacked points], Note [Points shared by torch 2.10
and 2.11] in torch_subclass_rt/points/__init__.py), and that runtime/
builds no replacement. Static: nothing is installed."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import unittest
from pathlib import Path

from torch_subclass_rt import _modes, points
from torch_subclass_rt._torch_compat import BACKPORT_VERSIONS, FIXES_VERSIONS, FORCED_VERSIONS
from torch_subclass_rt.patching import registry

PACKAGE = Path(points.__file__).parent.parent
ALL_VERSIONS = sorted({*BACKPORT_VERSIONS, *FIXES_VERSIONS, *FORCED_VERSIONS})
GROUPS = sorted({p.group for p in points.all_points() if p.group})


def _declared() -> dict[str, list[registry.PatchPoint]]:
    return {
        name: importlib.import_module(f"{points.__name__}.{name}").POINTS
        for name in points.SUBSYSTEMS
    }


class TestOneAxis(unittest.TestCase):
    def test_public_modules_are_the_subsystems(self):
        public = {
            m.name
            for m in pkgutil.iter_modules(points.__path__)
            if not m.name.startswith("_")
        }
        self.assertEqual(public, set(points.SUBSYSTEMS))

    def test_private_modules_declare_no_point(self):
        for m in pkgutil.iter_modules(points.__path__):
            if m.name.startswith("_"):
                module = importlib.import_module(f"{points.__name__}.{m.name}")
                self.assertFalse(hasattr(module, "POINTS"), m.name)
                held = [
                    k for k, v in vars(module).items() if isinstance(v, registry.PatchPoint)
                ]
                self.assertEqual(held, [], m.name)

    def test_name_prefix_and_target_follow_the_module(self):
        for module, declared in _declared().items():
            for p in declared:
                with self.subTest(point=p.name):
                    self.assertEqual(p.name.partition(".")[0], module)
                    self.assertEqual(points.subsystem_of(p.target), module, p.target)

    def test_subsystem_of_takes_the_longest_package(self):
        self.assertEqual(points.subsystem_of("torch._dynamo.guards:GuardBuilder.X"), "guards")
        self.assertEqual(points.subsystem_of("torch._dynamo.variables.builder:f"), "dynamo")
        self.assertEqual(points.subsystem_of("torch._functorch.partitioners:f"), "partitioners")
        self.assertIsNone(points.subsystem_of("torch._functorch.compilers:f"))


class TestTwins(unittest.TestCase):
    def test_a_name_twice_is_one_point_per_backport_release(self):
        by_name: dict[str, list[registry.PatchPoint]] = {}
        for p in points.all_points():
            by_name.setdefault(p.name, []).append(p)
        twins = {n: ps for n, ps in by_name.items() if len(ps) > 1}
        self.assertTrue(twins)
        for name, ps in twins.items():
            with self.subTest(point=name):
                self.assertEqual(
                    sorted(tuple(sorted(p.versions)) for p in ps), [("2.10.0",), ("2.11.0",)]
                )
                self.assertEqual({p.modes for p in ps}, {frozenset({_modes.Mode.BACKPORT})})

    def test_per_release_wants_a_difference(self):
        from torch_subclass_rt.points._versions import per_release

        with self.assertRaisesRegex(ValueError, "without a difference"):
            per_release(
                name="dynamo.x", target="torch._dynamo.x:f", build=lambda o: o,
                reason="r", series_none="s", v2_11={}, v2_10={},
            )


class TestInstallOrder(unittest.TestCase):
    def _check(self, ordered: list[registry.PatchPoint]) -> None:
        for version in ALL_VERSIONS:
            for mode in registry.MODES:
                selected = registry.select(ordered, version, mode, GROUPS)
                seen: dict[str, registry.PatchPoint] = {}
                for p in selected:
                    below = seen.get(p.target)
                    if below is not None:
                        with self.subTest(version=version, mode=str(mode), point=p.name):
                            # registry.plan stacks only an upstream fix on a
                            # point without one
                            self.assertTrue(p.upstream_fix)
                            self.assertFalse(below.upstream_fix, below.name)
                    seen.setdefault(p.target, p)

    def test_all_points_stack_fixes_last(self):
        self._check(points.all_points())

    def test_order_does_not_come_from_the_modules(self):
        # declaring the modules in another order gives a valid order too
        reversed_points = [p for ps in reversed(list(_declared().values())) for p in reversed(ps)]
        self._check(points.install_order(reversed_points))

    def test_some_point_stacks(self):
        # the check above is not vacuous: 2.11's backport stacks a fix
        stacked = [
            p
            for p in registry.select(points.all_points(), "2.11.0", _modes.Mode.BACKPORT)
            if p.upstream_fix
            and any(
                q.target == p.target and not q.upstream_fix
                for q in registry.select(points.all_points(), "2.11.0", _modes.Mode.BACKPORT)
            )
        ]
        self.assertTrue(stacked)


class TestRuntimeBuildsNothing(unittest.TestCase):
    """runtime/ is code torch calls into; what puts it in torch is points/."""

    def test_no_patching_import_and_no_build(self):
        for path in sorted((PACKAGE / "runtime").glob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                with self.subTest(file=path.name, line=getattr(node, "lineno", 0)):
                    if isinstance(node, ast.ImportFrom):
                        self.assertFalse(
                            (node.module or "").startswith(("patching", "points"))
                            and node.level >= 2,
                            "runtime/ imports the patching machinery",
                        )
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        args = [a.arg for a in node.args.args]
                        self.assertNotEqual(
                            args[:1], ["original"], f"{node.name} builds a replacement"
                        )


if __name__ == "__main__":
    unittest.main()
