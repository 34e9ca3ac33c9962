"""How points/ is organised (Note [One module per change], Note [Install
order of stacked points], Note [Points shared by torch 2.10 and 2.11] in
torch_subclass_rt/points/__init__.py), and that runtime/ builds no
replacement. Static: nothing is installed."""

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
POINTS_DIR = Path(points.__file__).parent
ALL_VERSIONS = sorted({*BACKPORT_VERSIONS, *FIXES_VERSIONS, *FORCED_VERSIONS})
GROUPS = sorted({p.group for p in points.all_points() if p.group})
#: what a declaration may splat: the version sets and upstream_fix(...)
VERSION_SETS = {"ONLY_BACKPORT", "RUNTIME", "ONLY_FORCED", "ONLY_2_11", "ONLY_2_10"}


def _declared() -> dict[str, list[registry.PatchPoint]]:
    return {
        name: importlib.import_module(f"{points.__name__}.{name}").POINTS
        for name in points.CHANGES
    }


def _computed_fields(source: str) -> list[str]:
    """Where a ``PatchPoint(...)`` or ``per_release(...)`` call in ``source``
    computes what must be a literal: its ``name`` (a str constant), its
    ``guarded_by`` and ``series`` (tuples of str constants), also inside
    ``per_release``'s ``v2_11=dict(...)`` / ``v2_10=dict(...)``; and any
    ``**`` splat but a version set or ``upstream_fix(...)``, which could
    carry those fields out of sight."""

    def literal_str(n: ast.AST) -> bool:
        return isinstance(n, ast.Constant) and isinstance(n.value, str)

    found: list[str] = []

    def check(keywords: list[ast.keyword], where: str, nested: bool) -> None:
        names = {k.arg for k in keywords}
        if not nested and "name" not in names:
            found.append(f"{where}: no name=")
        for k in keywords:
            at = f"{where} line {k.value.lineno}"
            if k.arg is None:
                ok = (isinstance(k.value, ast.Name) and k.value.id in VERSION_SETS) or (
                    isinstance(k.value, ast.Call)
                    and isinstance(k.value.func, ast.Name)
                    and k.value.func.id == "upstream_fix"
                )
                if not ok:
                    found.append(f"{at}: ** splat of {ast.unparse(k.value)}")
            elif k.arg == "name" and not literal_str(k.value):
                found.append(f"{at}: name={ast.unparse(k.value)}")
            elif k.arg in ("guarded_by", "series", "requires") and not (
                isinstance(k.value, ast.Tuple) and all(literal_str(e) for e in k.value.elts)
            ):
                found.append(f"{at}: {k.arg}={ast.unparse(k.value)}")
            elif k.arg in ("v2_11", "v2_10"):
                if not (
                    isinstance(k.value, ast.Call)
                    and isinstance(k.value.func, ast.Name)
                    and k.value.func.id == "dict"
                    and not k.value.args
                ):
                    found.append(f"{at}: {k.arg}= is not dict(...)")
                else:
                    check(k.value.keywords, f"{where} {k.arg}", nested=True)

    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("PatchPoint", "per_release")
        ):
            if node.args:
                found.append(f"line {node.lineno}: positional arguments")
            check(node.keywords, f"{node.func.id} line {node.lineno}", nested=False)
    return found


class TestOneModulePerChange(unittest.TestCase):
    def test_public_modules_are_the_changes(self):
        public = {
            m.name
            for m in pkgutil.iter_modules(points.__path__)
            if not m.name.startswith("_")
        }
        self.assertEqual(public, set(points.CHANGES))
        self.assertEqual(len(points.CHANGES), len(set(points.CHANGES)))

    def test_private_modules_declare_no_point(self):
        for m in pkgutil.iter_modules(points.__path__):
            if m.name.startswith("_"):
                module = importlib.import_module(f"{points.__name__}.{m.name}")
                self.assertFalse(hasattr(module, "POINTS"), m.name)
                held = [
                    k for k, v in vars(module).items() if isinstance(v, registry.PatchPoint)
                ]
                self.assertEqual(held, [], m.name)

    def test_each_change_declares_points(self):
        for module, declared in _declared().items():
            with self.subTest(change=module):
                self.assertIsInstance(declared, list)
                self.assertTrue(declared, "a change module declares at least one point")
                for p in declared:
                    self.assertIsInstance(p, registry.PatchPoint)

    def test_every_point_is_declared_by_one_change(self):
        declared = [p for ps in _declared().values() for p in ps]
        self.assertEqual(len({id(p) for p in declared}), len(declared))
        self.assertEqual({id(p) for p in points.all_points()}, {id(p) for p in declared})
        for p in declared[:3]:
            self.assertIn(points.change_of(p), points.CHANGES)

    def test_docstring_names_releases_modes_series_and_upstream(self):
        for module, declared in _declared().items():
            doc = importlib.import_module(f"{points.__name__}.{module}").__doc__ or ""
            with self.subTest(change=module):
                self.assertTrue(doc.strip(), "a change module says what the change is")
                flat = " ".join(doc.split())
                for p in declared:
                    for version in p.versions:
                        self.assertIn(version, flat, p.name)
                    for mode in p.modes:
                        self.assertIn(str(mode), flat, p.name)
                    for entry in p.series:
                        # the patch number, as the file name patches/v.../NNNN-...
                        self.assertIn(f"{entry.split()[0]}-", flat, p.name)
                    if p.upstream_fix:
                        self.assertIn(" ".join(p.upstream_fix.split()), flat, p.name)

    def test_private_modules_belong_to_no_change(self):
        private = {m.name for m in pkgutil.iter_modules(points.__path__) if m.name.startswith("_")}
        self.assertEqual(private, {"_dynamo_opaque", "_edit_api", "_versions"})


class TestGreppable(unittest.TestCase):
    """Every point's name, test ids and series entries are literals in its
    declaration (Note [One module per change]): grep finds them."""

    def test_declarations_are_literal(self):
        for name in points.CHANGES:
            with self.subTest(change=name):
                self.assertEqual(_computed_fields((POINTS_DIR / f"{name}.py").read_text()), [])

    def test_computed_fields_are_refused(self):
        computed = {
            "f-string name": 'PatchPoint(name=f"dynamo.{x}", series_none="s", **ONLY_BACKPORT)',
            "name from a constant": 'PatchPoint(name=_NAME, series_none="s")',
            "concatenated test id": 'PatchPoint(name="a.b", guarded_by=(_TEST + "test_x",))',
            "tuple constant": 'PatchPoint(name="a.b", guarded_by=_TESTS)',
            "f-string series": 'PatchPoint(name="a.b", series=(f"{_F}maybe_to_fake_obj",))',
            "per-release test id": 'per_release(name="a.b", v2_11=dict(guarded_by=(_T,)), v2_10=dict(x=1))',
            "fields in a splat": 'PatchPoint(name="a.b", **_SHARED)',
            "generated": '[PatchPoint(name=f"library.{a}") for a in ("__eq__", "__hash__")]',
        }
        for what, source in computed.items():
            with self.subTest(what):
                self.assertTrue(_computed_fields(source))
        self.assertEqual(
            _computed_fields(
                'PatchPoint(name="a.b", guarded_by=("t/x.py::T" "::test_y",), '
                'series=("0001 torch/x.py::f",), **upstream_fix("2.12.0"))'
            ),
            [],
        )


class TestNoPrivateReach(unittest.TestCase):
    def test_no_points_module_imports_private_names_of_another(self):
        for path in sorted(POINTS_DIR.glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ImportFrom):
                    continue
                module = node.module or ""
                within = (node.level == 1) or module.startswith("torch_subclass_rt.points")
                if not within:
                    continue
                for alias in node.names:
                    with self.subTest(file=path.name, line=node.lineno, name=alias.name):
                        self.assertFalse(
                            alias.name.startswith("_"),
                            f"{path.name} imports {alias.name} from .{module}",
                        )
                if node.level == 1 and not module:
                    # ``from . import x``: a module, read as x.<name>
                    for alias in node.names:
                        self.fail(f"{path.name}: from . import {alias.name}")


class TestChangeTable(unittest.TestCase):
    def test_design_doc_has_the_generated_table(self):
        design = (PACKAGE.parent / "docs" / "design.md").read_text()
        fixes = (PACKAGE.parent / "docs" / "fixes.md").read_text()
        begin, end = "<!-- change table: begin -->\n", "<!-- change table: end -->"
        self.assertIn(begin, design)
        table = design.split(begin, 1)[1].split(end, 1)[0]
        self.assertEqual(
            table,
            points.change_table(fixes),
            "docs/design.md's change table is stale: paste points.change_table() there",
        )

    def test_every_upstream_fix_has_its_section(self):
        fixes = (PACKAGE.parent / "docs" / "fixes.md").read_text()
        for row in points.change_table(fixes).splitlines()[2:]:
            cells = [c.strip() for c in row.strip("|").split("|")]
            with self.subTest(change=cells[1]):
                upstream, link = cells[4], cells[5]
                self.assertEqual(upstream == "-", link == "-", row)


class TestTestsMirrorChanges(unittest.TestCase):
    def test_each_fix_has_its_test_module(self):
        # from a PR number, grep finds the point module; its tests are then
        # test_<module>.py, and its guarded_by names that file
        tests = PACKAGE.parent / "test"
        for name, pts in _declared().items():
            if not any(p.upstream_fix for p in pts):
                continue
            with self.subTest(change=name):
                found = sorted(tests.rglob(f"test_{name}.py"))
                self.assertEqual(len(found), 1, f"points/{name}.py carries an upstream fix: "
                                                f"its tests go in one test/**/test_{name}.py")
                rel = found[0].relative_to(PACKAGE.parent).as_posix()
                named = {t.partition("::")[0] for p in pts for t in p.guarded_by}
                self.assertIn(rel, named, f"no point of {name} is guarded by {rel}")


class TestSubsystemView(unittest.TestCase):
    def test_name_prefix_is_the_subsystem_of_the_target(self):
        for p in points.all_points():
            with self.subTest(point=p.name):
                self.assertIsNotNone(points.subsystem_of(p.target), p.target)
                self.assertEqual(p.name.partition(".")[0], points.subsystem_of(p.target), p.target)

    def test_the_view_covers_every_point_once(self):
        every = points.all_points()
        view = points.by_subsystem(every)
        self.assertEqual(set(view) - set(points.SUBSYSTEMS), set())
        self.assertEqual(sorted(id(p) for ps in view.values() for p in ps), sorted(id(p) for p in every))

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

    def test_all_points_by_fix_then_subsystem_then_declared(self):
        # registry.plan resolves points in this order, and a point's
        # rebinds_if_loaded sees only the modules the points before it
        # imported: the order of the one-module-per-subsystem layout is kept
        rank = {name: i for i, name in enumerate(points.SUBSYSTEMS)}
        declared = [p for ps in _declared().values() for p in ps]
        expected = sorted(
            declared, key=lambda p: (bool(p.upstream_fix), rank[points.subsystem_of(p.target)])
        )
        self.assertEqual([id(p) for p in points.all_points()], [id(p) for p in expected])

    def test_lazy_members_fix_planned_after_the_aot_autograd_fixes(self):
        # library.maybe_to_fake_obj.lazy_members rebinds export's constant
        # lifting only if loaded, which the aot_autograd fix points before it
        # load (Note [Install order of stacked points])
        for version in ("2.12.1", "2.13.0", "2.14.1"):
            selected = [p.name for p in registry.select(points.all_points(), version, "native+fixes")]
            lazy = selected.index("library.maybe_to_fake_obj.lazy_members")
            cache_key = selected.index("aot_autograd.autograd_cache_key.opaque_reads")
            self.assertLess(cache_key, lazy, version)

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
