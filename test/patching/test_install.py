"""install() / uninstall() / status() / installed() and the patch registry's
transaction: idempotence, exact restoration, the version gate, rollback."""

from __future__ import annotations

import importlib
import sys
import types
import unittest
from unittest import mock

import harness

import torch

import torch_subclass_rt as tsrt
from torch_subclass_rt import _torch_compat
from torch_subclass_rt.patching import registry
from torch_subclass_rt.patching.registry import PatchError, PatchPoint
from torch_subclass_rt.points import all_points

MODE = harness.current_mode()

VERSION = _torch_compat.torch_version()
_MISSING = object()


def _patch_mode() -> str | None:
    """The mode in which install() patches this torch, if any (on 2.13.0 both
    forced and native+fixes patch; the mode under test picks)."""
    if VERSION in _torch_compat.BACKPORT_VERSIONS:
        return "backport"
    if MODE == "native+fixes" or (
        VERSION in _torch_compat.FIXES_VERSIONS
        and VERSION not in _torch_compat.FORCED_VERSIONS
    ):
        return "native+fixes"
    if VERSION in _torch_compat.FORCED_VERSIONS:
        return "forced"
    return None


PATCH_MODE = _patch_mode()
needs_patching_torch = unittest.skipIf(
    PATCH_MODE is None,
    f"torch {VERSION} has no patch points (neither backport nor forced)",
)


def _install_patching() -> tsrt.Status:
    return tsrt.install(force=(PATCH_MODE == "forced"))


def _slots_of(points) -> dict[tuple[object, str], object]:
    """(owner, attr) -> object now stored there, for every place the points
    write: the target itself and each module in its ``rebinds``."""
    snap: dict[tuple[object, str], object] = {}
    for point in points:
        try:
            owner, attr, _ = registry._resolve(point)
        except PatchError:
            continue  # a point for another torch release
        snap[(owner, attr)] = owner.__dict__.get(attr, _MISSING)
        loaded = [m for m in point.rebinds_if_loaded if m in sys.modules]
        for mod_name in (*point.rebinds, *loaded):
            try:
                mod = importlib.import_module(mod_name)
            except ImportError:
                continue  # a point for another torch release
            snap[(mod, attr)] = mod.__dict__.get(attr, _MISSING)
        for slot in registry._default_slots(point, snap[(owner, attr)]) if point.default_args else ():
            snap[(slot.owner, slot.attr, slot.key)] = slot.current()
    return snap


def _held(key) -> object:
    """What a slot key names holds now: ``owner.attr``, or one parameter
    default ``(function, "__defaults__" | "__kwdefaults__", index | name)``."""
    if len(key) == 3:
        return getattr(key[0], key[1])[key[2]]
    return key[0].__dict__.get(key[1], _MISSING)


def _key(slot) -> tuple:
    key = getattr(slot, "key", None)
    return (slot.owner, slot.attr) if key is None else (slot.owner, slot.attr, key)


def _describe(key) -> str:
    owner, attr, *default = key
    return f"{getattr(owner, '__name__', owner)}.{attr}" + (f"[{default[0]!r}]" if default else "")


class InstallTestCase(unittest.TestCase):
    def setUp(self):
        # every test starts uninstalled and leaves the mode under test behind
        self.addCleanup(harness.restore_mode)
        tsrt.uninstall()

    def assertSlotsHold(self, snapshot, msg=""):
        now = {key: _held(key) for key in snapshot}
        changed = [_describe(k) for k in snapshot if now[k] is not snapshot[k]]
        self.assertEqual(changed, [], f"not the very same objects: {msg}")


class TestInstall(InstallTestCase):
    @needs_patching_torch
    def test_install_twice_same_status(self):
        st1 = _install_patching()
        replacements = {
            _key(s): s.current() for a in tsrt._journal.applied for s in a.slots
        }
        st2 = _install_patching()
        self.assertEqual(st1, st2)
        self.assertEqual(st1.mode, PATCH_MODE)
        self.assertTrue(st1.points)
        # idempotent: the second install did not re-patch
        for key, obj in replacements.items():
            self.assertIs(_held(key), obj, _describe(key))

    @needs_patching_torch
    def test_uninstall_restores_every_slot_identically(self):
        points = registry.select(all_points(), VERSION, PATCH_MODE)
        self.assertTrue(points)
        before = _slots_of(points)

        st = _install_patching()
        self.assertEqual(st.points, tuple(p.name for p in points))
        journaled = {_key(s) for a in tsrt._journal.applied for s in a.slots}
        # every journaled slot was snapshotted, and every planned slot journaled
        self.assertEqual(
            sorted(map(_describe, journaled)), sorted(map(_describe, before))
        )
        for key in before:
            self.assertIsNot(_held(key), before[key], _describe(key))
        for point in points:
            attr = point.attr_path[-1]
            for mod_name in point.rebinds:
                mod = sys.modules[mod_name]
                self.assertIn((mod, attr), journaled, f"{point.name}: {mod_name}")

        st = tsrt.uninstall()
        self.assertEqual(st.mode, "off")
        self.assertEqual(st.points, ())
        self.assertSlotsHold(before, "after uninstall")

        # uninstall again: a no-op
        self.assertEqual(tsrt.uninstall(), st)
        self.assertSlotsHold(before, "after a second uninstall")

    @needs_patching_torch
    def test_code_compiled_while_installed_never_runs_after_uninstall(self):
        from torch._dynamo.testing import CompileCounterWithBackend

        from torch_subclass_rt.examples.mesh_tensor import MeshHandle, MeshTensor

        _install_patching()
        cnt = CompileCounterWithBackend("aot_eager")
        f = torch.compile(lambda x: x.sin() + 1, backend=cnt, fullgraph=True)
        x = MeshTensor(torch.randn(4, requires_grad=True), MeshHandle("a"))
        f(x).sum().backward()
        self.assertEqual(cnt.frame_count, 1)
        tsrt.uninstall()

        x2 = MeshTensor(torch.randn(4, requires_grad=True), MeshHandle("b"))
        if PATCH_MODE == "backport":
            # reset by uninstall(): the call recompiles on stock 2.11, which
            # cannot trace opaque attrs, instead of running the installed
            # runtime's graph and failing in its backward
            with self.assertRaisesRegex(Exception, "'MeshHandle' object has no attribute 'is_nested'"):
                f(x2)
            self.assertEqual(cnt.frame_count, 1)
        else:
            # forced, native+fixes: the metadata is torch's own; the compiled graph runs on
            out = f(x2)
            out.sum().backward()
            self.assertIs(out.mesh, x2.mesh)
            self.assertIs(x2.grad.mesh, x2.mesh)
            self.assertEqual(cnt.frame_count, 1)
        torch._dynamo.reset()

    @needs_patching_torch
    def test_install_uninstall_cycles(self):
        points = registry.select(all_points(), VERSION, PATCH_MODE)
        before = _slots_of(points)
        for _ in range(3):
            _install_patching()
            tsrt.uninstall()
        self.assertSlotsHold(before, "after three install/uninstall cycles")

    @unittest.skipIf(
        not _torch_compat.has_native_support(VERSION),
        f"torch {VERSION} has no native support; install() always patches",
    )
    def test_install_without_force_on_native_torch_patches_nothing(self):
        # a native release with no known bug (this one, were it not listed
        # as lacking upstream fixes)
        before = _slots_of(all_points())
        with mock.patch.object(_torch_compat, "FIXES_VERSIONS", ()):
            st = tsrt.install()
        self.assertEqual(st.mode, "native")
        self.assertEqual(st.points, ())
        self.assertTrue(st.active)
        self.assertSlotsHold(before, "native install")

    @unittest.skipIf(
        VERSION not in _torch_compat.FIXES_VERSIONS,
        f"torch {VERSION} lacks no upstream fix we carry",
    )
    def test_native_release_with_known_bugs_applies_exactly_the_fix_points(self):
        points = registry.select(all_points(), VERSION, "native+fixes")
        self.assertTrue(points)
        before = _slots_of(points)
        st = tsrt.install()
        self.assertEqual(st.mode, "native+fixes")
        self.assertTrue(st.active)
        self.assertEqual(st.points, tuple(p.name for p in points))
        for p in points:
            # a merged PR, an issue still open upstream (fixed here only), or
            # a torch bug we found that has no upstream issue yet
            self.assertRegex(
                p.upstream_fix, r"^(PR \d+|issue \d+|torch bug: )", p.name
            )
            self.assertIn(VERSION, p.versions)
            self.assertTrue(p.guarded_by, p.name)
        # only fix points: native torch's own implementation stays in place
        self.assertEqual([p for p in points if not p.upstream_fix], [])
        tsrt.uninstall()
        self.assertEqual(tsrt.status().mode, "off")
        self.assertSlotsHold(before, "after uninstall of native+fixes")

    @unittest.skipIf(
        VERSION not in _torch_compat.FORCED_VERSIONS,
        f"forced mode exists on torch {', '.join(_torch_compat.FORCED_VERSIONS)} only",
    )
    def test_forced_carries_the_fixes_of_its_release(self):
        # forced mode stands for the newest release, so it has its fixes too
        fixes = [p.name for p in registry.select(all_points(), VERSION, "native+fixes")]
        st = tsrt.install(force=True)
        self.assertEqual(st.mode, "forced")
        self.assertTrue(fixes)
        self.assertEqual(list(st.points[-len(fixes):]), fixes)
        # a plain install() afterwards keeps forced (it has the fixes)
        self.assertEqual(tsrt.install(), st)

    @needs_patching_torch
    def test_self_check_probe_leaves_torchs_opaque_registry(self):
        # install()'s self-check registers a probe opaque type for its
        # check only: neither while installed nor after uninstall() does
        # torch's registry know it (a second install checks again)
        from torch_subclass_rt import install_check

        def probe_entries():
            probe = install_check._probe and install_check._probe[1]
            return [
                (name, key)
                for name, reg in install_check._opaque_registries().items()
                for key in list(reg.keys())
                if key is probe or "_SelfCheckHandle" in str(key)
            ]

        for _ in range(2):
            _install_patching()
            self.assertIsNotNone(install_check._probe)
            self.assertEqual(probe_entries(), [])
            self.assertFalse(_torch_compat.is_registered_opaque_type(install_check._probe[1]))
            tsrt.uninstall()
            self.assertEqual(probe_entries(), [])

    @unittest.skipUnless(VERSION == "2.10.0", "torch 2.10's backport has no dtensor group")
    def test_dtensor_opt_in_refused_on_torch_2_10(self):
        # 2.11's opt-in group has no 2.10 points: refused before anything
        # is touched, instead of an install that silently lacks it
        from torch._library import opaque_object

        before = (opaque_object.register_opaque_type, opaque_object._OPAQUE_TYPES)
        with self.assertRaisesRegex(ValueError, r"install\(dtensor=True\): torch 2.10.0's backport has no dtensor group.*torch 2.11.0 only.*Nothing was installed"):
            tsrt.install(dtensor=True)
        self.assertEqual(tsrt.status().mode, "off")
        self.assertFalse(hasattr(opaque_object, "MemberType"))
        self.assertIs(opaque_object.register_opaque_type, before[0])
        self.assertIs(opaque_object._OPAQUE_TYPES, before[1])

    @unittest.skipIf(
        VERSION not in _torch_compat.FORCED_VERSIONS,
        f"forced mode exists on torch {', '.join(_torch_compat.FORCED_VERSIONS)} only",
    )
    def test_forced_then_plain_install_keeps_forced(self):
        st = tsrt.install(force=True)
        self.assertEqual(st.mode, "forced")
        self.assertEqual(tsrt.install(), st)


class TestVersionGate(InstallTestCase):
    def _assert_refused(self, version, force, supported):
        before_status = tsrt.status()
        before = _slots_of(all_points())
        with mock.patch.object(torch, "__version__", version):
            with self.assertRaises(tsrt.UnsupportedTorchVersion) as ctx:
                tsrt.install(force=force)
        msg = str(ctx.exception)
        self.assertIn(version.split("+")[0], msg)
        for v in supported:
            self.assertIn(v, msg)
        self.assertEqual(tsrt.status(), before_status)
        self.assertSlotsHold(before, f"refused install on {version}")

    def test_refuses_torch_2_9(self):
        self._assert_refused("2.9.1", False, _torch_compat.BACKPORT_VERSIONS)
        self._assert_refused("2.9.1+cu128", True, _torch_compat.BACKPORT_VERSIONS)

    def test_mode_per_release(self):
        choose = tsrt._choose_mode
        for version in _torch_compat.FIXES_VERSIONS:
            self.assertEqual(choose(version, False), "native+fixes", version)
        self.assertEqual(choose("2.99.0", False), "native")
        self.assertEqual(choose("2.10.0", False), "backport")
        self.assertEqual(choose("2.11.0", False), "backport")
        for version in _torch_compat.FORCED_VERSIONS:
            self.assertEqual(choose(version, True), "forced", version)

    def test_version_tuple(self):
        # the one version parser: a pre-release or local suffix is never part
        # of a number (2.12.0rc1 once parsed as (2, 12, 1))
        vt = _torch_compat.version_tuple
        self.assertEqual(vt("2.11.0"), (2, 11, 0))
        self.assertEqual(vt("2.12.0rc1"), (2, 12, 0))
        self.assertEqual(vt("2.13.0a0+git70d99e9"), (2, 13, 0))
        self.assertEqual(vt("2.11.0+cu130"), (2, 11, 0))
        self.assertEqual(vt("2.14"), (2, 14))
        self.assertEqual(vt(), vt(VERSION))
        self.assertEqual(harness.torch_major_minor(), vt()[:2])
        self.assertFalse(_torch_compat.has_native_support("2.11.9rc1"))
        self.assertTrue(_torch_compat.has_native_support("2.12.0rc1"))

    def test_refuses_force_on_unverified_native_torch(self):
        self._assert_refused("2.99.0", True, _torch_compat.FORCED_VERSIONS)

    @needs_patching_torch
    def test_refusal_leaves_an_installed_torch_installed(self):
        st = _install_patching()
        journal = tsrt._journal
        self._assert_refused("2.9.1", False, _torch_compat.BACKPORT_VERSIONS)
        self.assertEqual(tsrt.status(), st)
        self.assertIs(tsrt._journal, journal)

    def test_unsupported_torch_version_is_runtime_error(self):
        self.assertTrue(issubclass(tsrt.UnsupportedTorchVersion, RuntimeError))


class TestStatus(InstallTestCase):
    def test_repr_off(self):
        st = tsrt.status()
        self.assertEqual(st.mode, "off")
        self.assertFalse(st.active)
        self.assertEqual(
            repr(st), f"Status(torch={VERSION}, mode='off', 0 patch point(s))"
        )

    @needs_patching_torch
    def test_repr_installed(self):
        st = _install_patching()
        text = repr(st)
        self.assertTrue(
            text.startswith(
                f"Status(torch={VERSION}, mode={PATCH_MODE!r}, "
                f"{len(st.points)} patch point(s): "
            ),
            text,
        )
        self.assertTrue(text.endswith(")"), text)
        for name in st.points:
            self.assertIn(name, text)
        self.assertNotIn("\n", text)
        self.assertTrue(st.active)

    def test_mode_is_the_enum_and_its_string(self):
        # one Mode enum everywhere; a str enum, so comparisons, TSRT_MODE,
        # JSON and printing see the plain string as before
        import json

        st = tsrt.status()
        self.assertIs(st.mode, tsrt.Mode.OFF)
        self.assertEqual(st.mode, "off")
        self.assertEqual((str(st.mode), f"{st.mode}", repr(st.mode)), ("off", "off", "'off'"))
        self.assertEqual(json.dumps(st.mode), '"off"')
        self.assertIs(tsrt.Mode("native+fixes"), tsrt.Mode.NATIVE_FIXES)
        self.assertIs(harness.current_mode(), tsrt.Mode(MODE))
        for point in all_points():
            self.assertLessEqual(point.modes, registry.MODES, point.name)
            self.assertTrue(all(type(m) is tsrt.Mode for m in point.modes), point.name)

    @needs_patching_torch
    def test_cli_status_lists_each_points_guards(self):
        import contextlib
        import io

        from torch_subclass_rt.__main__ import main

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(main(["status", "--install"] + (["--force"] if PATCH_MODE == "forced" else [])), 0)
        # "  * <name>  <reason>" then indented lines: series, guarded by
        blocks: dict[str, list[str]] = {}
        for line in out.getvalue().split("patch points for torch", 1)[1].splitlines()[1:]:
            if line[4:5].strip():
                blocks[line[4:].split()[0]] = []
            else:
                blocks[list(blocks)[-1]].append(" ".join(line.split()))
        known = all_points()  # a name may be declared once per release
        groups = {p.group for p in known if p.group}
        points = {p.name: p for p in registry.select(known, VERSION, PATCH_MODE, groups)}
        self.assertLessEqual(set(tsrt.status().points), set(blocks))
        for name, lines in blocks.items():
            tests = points[name].guarded_by
            guards = [ln for ln in lines if not ln.startswith(("series ", "not in the series", "speed-only"))]
            want = [f"guarded by {tests[0]}", *tests[1:]] if tests else ["guarded by no test names it"]
            self.assertEqual(guards, want, name)

    def test_status_is_frozen(self):
        st = tsrt.status()
        with self.assertRaises(Exception):
            st.mode = "native"  # type: ignore[misc]


class TestInstalledContextManager(InstallTestCase):
    @needs_patching_torch
    def test_installed_from_off_restores_off(self):
        points = registry.select(all_points(), VERSION, PATCH_MODE)
        before = _slots_of(points)
        with tsrt.installed(force=(PATCH_MODE == "forced")) as st:
            self.assertEqual(st.mode, PATCH_MODE)
            self.assertEqual(tsrt.status(), st)
        self.assertEqual(tsrt.status().mode, "off")
        self.assertSlotsHold(before, "after installed()")

    @needs_patching_torch
    def test_installed_restores_on_error(self):
        points = registry.select(all_points(), VERSION, PATCH_MODE)
        before = _slots_of(points)
        with self.assertRaises(KeyError):
            with tsrt.installed(force=(PATCH_MODE == "forced")):
                raise KeyError("boom")
        self.assertEqual(tsrt.status().mode, "off")
        self.assertSlotsHold(before, "after installed() raised")

    @needs_patching_torch
    def test_installed_inside_install_keeps_it(self):
        st = _install_patching()
        with tsrt.installed(force=(PATCH_MODE == "forced")) as inner:
            self.assertEqual(inner, st)
        self.assertEqual(tsrt.status(), st)


# --------------------------------------------------------------------------
# the registry's transaction, on harmless targets of this module


def _harmless_fn():
    return "original fn"


class _Harmless:
    def method(self):
        return "original method"

    @staticmethod
    def static():
        return "original static"


def _takes_default(fn=_harmless_fn, *, kw_fn=_harmless_fn):
    return fn(), kw_fn()


class _LockedMeta(type):
    def __setattr__(cls, name, value):
        if name == "locked":
            raise AttributeError("locked is read-only")
        super().__setattr__(name, value)


class _Locked(metaclass=_LockedMeta):
    def locked(self):
        return "original locked"


_V = frozenset({VERSION})
_M = frozenset({"forced"})


def _point(name, target, build, **kw):
    kw.setdefault("series_none", "a test point")
    return PatchPoint(name, target, build, _V, _M, reason="test", **kw)


class TestRegistryTransaction(unittest.TestCase):
    def setUp(self):
        self.mod = __name__
        # a module that did `from <this module> import _harmless_fn`
        self.importer = types.ModuleType("_tsrt_test_importer")
        self.importer._harmless_fn = _harmless_fn
        sys.modules[self.importer.__name__] = self.importer
        self.addCleanup(sys.modules.pop, self.importer.__name__, None)
        self.originals = {
            "fn": sys.modules[self.mod].__dict__["_harmless_fn"],
            "method": _Harmless.__dict__["method"],
            "static": _Harmless.__dict__["static"],
            "locked": _Locked.__dict__["locked"],
        }

    def assertUntouched(self):
        self.assertIs(sys.modules[self.mod].__dict__["_harmless_fn"], self.originals["fn"])
        self.assertIs(self.importer.__dict__["_harmless_fn"], self.originals["fn"])
        self.assertIs(_Harmless.__dict__["method"], self.originals["method"])
        self.assertIs(_Harmless.__dict__["static"], self.originals["static"])
        self.assertIs(_Locked.__dict__["locked"], self.originals["locked"])
        self.assertNotIn("added", _Harmless.__dict__)

    def good_points(self):
        return [
            _point(
                "t.fn",
                f"{self.mod}:_harmless_fn",
                lambda orig: lambda: "patched " + orig(),
                rebinds=(self.importer.__name__,),
            ),
            _point(
                "t.method",
                f"{self.mod}:_Harmless.method",
                lambda orig: lambda self: "patched " + orig(self),
            ),
            _point(
                "t.static",
                f"{self.mod}:_Harmless.static",
                lambda orig: staticmethod(lambda: "patched " + orig.__func__()),
            ),
            _point(
                "t.added",
                f"{self.mod}:_Harmless.added",
                lambda orig: (lambda self: "added"),
                new_attribute=True,
            ),
        ]

    def test_apply_and_revert_round_trip(self):
        journal = registry.apply(self.good_points())
        try:
            self.assertEqual(_harmless_fn(), "patched original fn")
            self.assertEqual(self.importer._harmless_fn(), "patched original fn")
            self.assertEqual(_Harmless().method(), "patched original method")
            self.assertEqual(_Harmless.static(), "patched original static")
            self.assertEqual(_Harmless().added(), "added")
            self.assertEqual(journal.names(), ["t.fn", "t.method", "t.static", "t.added"])
        finally:
            self.assertEqual(journal.revert(), [])
        self.assertUntouched()

    def test_upstream_fix_stacks_on_a_point_of_the_same_target(self):
        base = self.good_points()[0]
        fix = _point(
            "t.fn.fix",
            f"{self.mod}:_harmless_fn",
            lambda below: lambda: "fixed " + below(),
            rebinds=(self.importer.__name__,),
            upstream_fix="PR 1",
        )
        journal = registry.apply([base, fix])
        try:
            self.assertEqual(_harmless_fn(), "fixed patched original fn")
            self.assertEqual(self.importer._harmless_fn(), "fixed patched original fn")
        finally:
            self.assertEqual(journal.revert(), [])
        self.assertUntouched()

    def test_same_target_twice_without_upstream_fix_is_refused(self):
        base = self.good_points()[1]
        again = _point("t.method2", f"{self.mod}:_Harmless.method", lambda o: o)
        with self.assertRaisesRegex(PatchError, "patched twice"):
            registry.apply([base, again])
        self.assertUntouched()

    def test_failing_build_touches_nothing(self):
        def bad_build(orig):
            raise ValueError("cannot build")

        bad = _point("t.bad", f"{self.mod}:_Harmless.method", bad_build)
        good = self.good_points()[0]
        with self.assertRaisesRegex(PatchError, "t.bad.*cannot build"):
            registry.apply([good, bad])
        self.assertUntouched()

    def test_failing_set_rolls_back_the_good_points(self):
        bad = _point("t.locked", f"{self.mod}:_Locked.locked", lambda orig: lambda self: 1)
        with self.assertRaises(AttributeError):
            registry.apply(self.good_points() + [bad])
        self.assertUntouched()

    def test_failing_self_check_rolls_back(self):
        def self_check():
            # the points really were applied when the check ran
            self.assertEqual(_harmless_fn(), "patched original fn")
            raise PatchError("self-check failed")

        with self.assertRaisesRegex(PatchError, "self-check failed"):
            registry.apply(self.good_points(), self_check=self_check)
        self.assertUntouched()

    def test_missing_target_refused(self):
        missing = _point("t.missing", f"{self.mod}:_Harmless.nope", lambda o: o)
        with self.assertRaisesRegex(PatchError, "does not exist"):
            registry.apply(self.good_points()[:1] + [missing])
        self.assertUntouched()

    def test_stale_rebind_list_refused(self):
        self.importer._harmless_fn = lambda: "someone else's"
        with self.assertRaisesRegex(PatchError, "rebind"):
            registry.apply(self.good_points()[:1])
        self.importer._harmless_fn = self.originals["fn"]
        self.assertUntouched()

    def test_same_target_twice_refused(self):
        p = self.good_points()[1]
        with self.assertRaisesRegex(PatchError, "patched twice"):
            registry.apply([p, p])
        self.assertUntouched()

    def test_default_args_round_trip(self):
        # partition_fn=default_partition: a default bound when the def ran
        point = _point(
            "t.fn",
            f"{self.mod}:_harmless_fn",
            lambda orig: lambda: "patched " + orig(),
            rebinds=(self.importer.__name__,),
            default_args=(f"{self.mod}:_takes_default",),
        )
        journal = registry.apply([point])
        try:
            self.assertEqual(_takes_default(), ("patched original fn", "patched original fn"))
        finally:
            self.assertEqual(journal.revert(), [])
        self.assertIs(_takes_default.__defaults__[0], self.originals["fn"])
        self.assertIs(_takes_default.__kwdefaults__["kw_fn"], self.originals["fn"])
        self.assertEqual(_takes_default(), ("original fn", "original fn"))
        self.assertUntouched()

    def test_rebinds_if_loaded(self):
        point = _point(
            "t.fn",
            f"{self.mod}:_harmless_fn",
            lambda orig: lambda: "patched " + orig(),
            rebinds_if_loaded=(self.importer.__name__, "_tsrt_test_never_imported"),
        )
        journal = registry.apply([point])
        try:
            self.assertEqual(self.importer._harmless_fn(), "patched original fn")
            self.assertNotIn("_tsrt_test_never_imported", sys.modules)
        finally:
            self.assertEqual(journal.revert(), [])
        self.assertUntouched()

    def test_stale_default_args_refused(self):
        point = _point(
            "t.fn",
            f"{self.mod}:_harmless_fn",
            lambda orig: lambda: "patched",
            rebinds=(self.importer.__name__,),
            default_args=(f"{self.mod}:_Harmless.method",),  # no such default
        )
        with self.assertRaisesRegex(PatchError, "default_args"):
            registry.apply(self.good_points()[1:2] + [point])
        self.assertUntouched()

    def test_misspelled_subsystem_is_an_error(self):
        # all_points() once skipped a points module that did not import
        # ("not written yet"): a typo silently installed fewer points
        from torch_subclass_rt import points

        with mock.patch.object(points, "CHANGES", (*points.CHANGES, "dynamoo")):
            with self.assertRaises(ModuleNotFoundError):
                points.all_points()


if __name__ == "__main__":
    unittest.main()
