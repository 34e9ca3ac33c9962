"""Torch bug: opaque member reads in the AOTAutograd cache.

A torch bug with no upstream issue yet (patches/upstream/ISSUES.md, our
patches/upstream/0003), fixed on the native releases (native+fixes,
forced).

Releases and modes: 2.12.0, 2.12.1, 2.13.0, 2.14.0, 2.14.1 (forced,
    native+fixes).
Series commits: none.
Upstream: torch bug: opaque reads in the AOTAutograd cache (no upstream
    issue yet; patches/upstream/ISSUES.md).

A compiled graph that read an opaque's members while tracing is reused
only where those reads give the same values (a torch bug of 2.12.0 to
2.14.1 that ``install()`` fixes; no upstream issue yet:
patches/upstream/ISSUES.md, "AOTAutogradCache reuses a graph whose opaque
member reads differ").

Note [Opaque reads in the AOTAutograd cache]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
AOTAutograd's cache key (``autograd_cache_key``) hashes the Dynamo graph
and its example inputs. From torch 2.12 on, an opaque among them (an inner
attr of a subclass, or a graph input of its own) enters the key by its type
name only (``AOTAutogradCachePickler._stable_hash_for_cache_value``: "only
the type matters"), which is right for the graph input itself: the graph
takes the runtime object. It is wrong for what tracing *read* off the
object: a subclass's ``__torch_dispatch__`` that calls ``comm.size()`` or
DTensor's redistribute that asks ``mesh.get_coordinate()`` bakes the answer
into the AOT graph as a constant, and the Dynamo graph (the key) does not
show it. So

* in one process, a recompile that Dynamo made because a ``guard_fn`` value
  changed gets the first compile's artifact back from the cache, and
* across processes sharing a cache directory (the default one is per user:
  every rank on a host), rank 1 loads rank 0's graph, with rank 0's chunk.

torch 2.10 and 2.11 pickle the real object into the key (every distinct
object is a miss), so they are right, and slower to warm up.

The fix keeps the key and adds what a guard would: while AOTAutograd
traces a graph it missed, every registered member read through an opaque's
fake (``FakeScriptObject.__getattribute__``, the door every read of a fake
goes through) is recorded as a path from
the graph's inputs (input k, then ``.member`` or ``.method(args)``) with a
fingerprint of the value. The record is saved with the cache entry; a
lookup replays each path against the call's own objects and skips an entry
whose values differ, as it skips one whose shape guards fail. An entry
without a record (saved by stock torch) is not trusted when the graph has
opaque inputs. A read of an opaque that is not reachable from the inputs (a
global captured as a constant), or a value with no fingerprint, leaves the
entry unsaved: never wrong, only uncached. A hit stays a hit wherever
nothing that was read differs (equal meshes on every rank, the demo's
warm start).
"""

from __future__ import annotations

import enum
import functools
import inspect
import threading
import types
from typing import Any

from .._torch_compat import is_registered_opaque_type
from ..patching.registry import PatchPoint
from ._versions import upstream_fix

#: the attribute of a cache entry that carries its record
ENTRY_ATTR = "tsrt_opaque_reads"
_FAKE_OWN = frozenset({"wrapped_obj", "script_class_name", "real_obj"})

_local = threading.local()

#: the releases whose AOTAutogradCache keys an opaque by its type alone
BROKEN_ON = ("2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1")
FIX = (
    "torch bug: opaque reads in the AOTAutograd cache (no upstream issue yet; "
    "patches/upstream/ISSUES.md)"
)
SERIES_NONE = (
    "torch 2.10/2.11 pickle an opaque's real object into the AOTAutograd "
    "cache key, so their caches never reuse a graph across differing reads"
)


class Unrecordable(Exception):
    """A read whose value cannot be compared in another process."""


# --------------------------------------------------------------------------
# fingerprints: plain, picklable data that compares equal across processes


def fingerprint(value: Any) -> Any:
    import torch

    if value is None or isinstance(value, (bool, int, float, str, bytes, complex)):
        return (type(value).__name__, value)
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return (type(value).__name__, str(value))
    if isinstance(value, enum.Enum):
        return ("enum", type(value).__qualname__, value.name)
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor or value.is_meta or value.numel() > 4096:
            raise Unrecordable(f"a {type(value).__name__} of {value.numel()} elements")
        return ("tensor", str(value.dtype), tuple(value.shape), value.detach().cpu().tolist())
    if isinstance(value, (tuple, list)):
        # torch.Size, named tuples and lists: their items
        return (type(value).__name__, tuple(fingerprint(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((fingerprint(k), fingerprint(v)) for k, v in value.items()))
    if is_registered_opaque_type(type(value)):
        # reads on it are recorded as paths through the read that gave it
        return ("opaque", type(value).__qualname__)
    try:
        # a value type the user compares by value (a dataclass, a layout)
        if type(value).__eq__ is not object.__eq__:
            import pickle

            return ("pickled", type(value).__qualname__, pickle.dumps(value))
    except Exception:
        pass
    raise Unrecordable(f"a {type(value).__qualname__}")


# --------------------------------------------------------------------------
# the inputs' opaques


def _real(x: Any) -> Any:
    from torch._library.fake_class_registry import FakeScriptObject

    if isinstance(x, FakeScriptObject):
        return object.__getattribute__(x, "real_obj")
    return x


def input_opaques(args: Any) -> list[Any]:
    """The real opaques among ``args`` (AOTAutograd's flat example inputs)
    and in their subclasses' inner attrs, depth first, in flatten order."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    found: list[Any] = []

    def walk(x: Any) -> None:
        x = _real(x)
        if x is not None and is_registered_opaque_type(type(x)):
            found.append(x)
        elif is_traceable_wrapper_subclass(x):
            attrs, _ctx = x.__tensor_flatten__()
            for name in attrs:
                walk(getattr(x, name))

    for a in args:
        walk(a)
    return found


def _aliasing(roots: list[Any]) -> tuple[int, ...]:
    first: dict[int, int] = {}
    return tuple(first.setdefault(id(r), i) for i, r in enumerate(roots))


# --------------------------------------------------------------------------
# the record of one compile


class Recording:
    """The reads of one AOTAutograd compile, from its cache key to its save."""

    def __init__(self, key: str, roots: list[Any]) -> None:
        from torch._guards import TracingContext

        self.key = key
        # the compile this record belongs to: reads made in another (the
        # next frame's Dynamo tracing, after a hit or a failed compile left
        # this one behind) are not this graph's, and Dynamo must see the
        # members unwrapped (it guards on what it reads)
        self.context = TracingContext.try_get()
        self.roots = roots
        self.aliasing = _aliasing(roots)
        self.paths: dict[int, tuple] = {}
        self.keep: list[Any] = list(roots)  # ids stay valid while recording
        for i, r in enumerate(roots):
            self.paths.setdefault(id(r), (i,))
        self.reads: list[tuple[tuple, Any]] = []
        self.unrecordable: str | None = None

    def read(self, owner: Any, step: tuple, value: Any) -> None:
        path = self.paths.get(id(owner))
        if path is None:
            self.unrecordable = (
                f"a member of a {type(owner).__qualname__} that is not among the "
                f"graph's inputs was read ({step[1]!r})"
            )
            return
        path = (*path, step)
        try:
            fp = fingerprint(value)
        except Unrecordable as e:
            self.unrecordable = f"{type(owner).__qualname__}.{step[1]} gave {e}"
            return
        if fp[0] == "opaque" and id(value) not in self.paths:
            self.keep.append(value)
            self.paths[id(value)] = path
        self.reads.append((path, fp))

    def record(self) -> tuple:
        return (self.aliasing, tuple(dict.fromkeys(self.reads)))


def current() -> Recording | None:
    """The record of the compile under way, if any."""
    from torch._guards import TracingContext

    recording = getattr(_local, "recording", None)
    if recording is None or TracingContext.try_get() is not recording.context:
        return None
    return recording


def _evaluate(roots: list[Any], path: tuple) -> Any:
    from torch.utils._python_dispatch import _disable_current_modes

    value = roots[path[0]]
    with _disable_current_modes():
        for step in path[1:]:
            if step[0] == "attr":
                value = getattr(value, step[1])
            else:
                _kind, name, args, kwargs = step
                value = getattr(value, name)(*args, **dict(kwargs))
    return value


def replays(record: Any, roots: list[Any], aliasing: tuple[int, ...]) -> bool:
    """Whether every read of ``record`` gives the same value on ``roots``
    (whose sharing is ``aliasing``)."""
    if not isinstance(record, tuple) or len(record) != 2:
        return False
    saved_aliasing, reads = record
    if saved_aliasing != aliasing:
        return False
    for path, fp in reads:
        if path[0] >= len(roots):
            return False
        try:
            if fingerprint(_evaluate(roots, path)) != fp:
                return False
        except Exception:
            return False
    return True


# --------------------------------------------------------------------------
# the replacements


def _build_autograd_cache_key(original):
    @functools.wraps(original)
    def autograd_cache_key(gm, example_inputs, config, *args, **kwargs):
        """Wraps ``torch._functorch._aot_autograd.autograd_cache.
        autograd_cache_key`` (torch 2.12.0 to 2.14.1). Differs: a graph
        with opaque inputs starts the record of its reads (Note [Opaque
        reads in the AOTAutograd cache]); the key is the release's."""
        result = original(gm, example_inputs, config, *args, **kwargs)
        roots = input_opaques(example_inputs)
        _local.recording = Recording(result[0], roots) if roots else None
        return result

    return autograd_cache_key


def _build_iterate_over_candidates(original):
    # a classmethod in the class __dict__: wrap its function
    func = original.__func__

    @functools.wraps(func)
    def iterate_over_candidates(cls, local, remote_cache, key):
        """Wraps ``GuardedCache.iterate_over_candidates`` (torch 2.12.0 to
        2.14.1). Differs: for AOTAutograd's cache, an entry whose recorded
        opaque reads give other values on this call's objects is not a
        candidate (Note [Opaque reads in the AOTAutograd cache])."""
        recording = current()
        from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache

        if (
            recording is None
            or recording.key != key
            or not (isinstance(cls, type) and issubclass(cls, AOTAutogradCache))
        ):
            yield from func(cls, local, remote_cache, key)
            return
        for found in func(cls, local, remote_cache, key):
            # (entry, pickled content, whether it came from the local cache)
            if replays(getattr(found[0], ENTRY_ATTR, None), recording.roots, recording.aliasing):
                yield found

    return classmethod(iterate_over_candidates)


def _build_save(original):
    func = original.__func__ if isinstance(original, staticmethod) else original

    @functools.wraps(func)
    def save(key, entry, remote):
        """Wraps ``AOTAutogradCache.save`` (torch 2.12.0 to 2.14.1).
        Differs: an entry of a graph with opaque inputs carries the record
        of the members its tracing read, or, where a read cannot be
        replayed in another process, is not saved (Note [Opaque reads in
        the AOTAutograd cache])."""
        recording = current()
        if recording is not None and recording.key == key:
            _local.recording = None
            if recording.unrecordable is not None:
                from torch._dynamo.utils import counters

                counters["aot_autograd"]["autograd_cache_bypass"] += 1
                return None
            setattr(entry, ENTRY_ATTR, recording.record())
        return func(key, entry, remote)

    return staticmethod(save)


def _method_recorder(name: str, bound: Any) -> Any:
    def call(receiver: Any, *args: Any, **kwargs: Any) -> Any:
        value = bound(*args, **kwargs)
        recording = current()
        if recording is not None:
            try:
                step = ("call", name, tuple(args), tuple(sorted(kwargs.items())))
                hash(step)
            except TypeError:
                recording.unrecordable = f"{name} was called with unhashable arguments"
                return value
            recording.read(receiver, step, value)
        return value

    call.__name__ = call.__qualname__ = name
    return call


#: the release's ``FakeScriptObject.__getattribute__`` while the point is
#: installed (a module global, not a closure: below)
_release_getattribute: Any = None


def _build_fake_getattribute(original):
    global _release_getattribute
    _release_getattribute = original
    return _fake_getattribute


def _fake_getattribute(self, name):
    """Wraps ``FakeScriptObject.__getattribute__`` (torch 2.12.0 to 2.14.1).
    Differs: while AOTAutograd traces a graph it will cache (Note [Opaque
    reads in the AOTAutograd cache]), a read of a ``USE_REAL`` member of the
    real object is recorded, whether the fake already holds it or
    ``__getattr__`` (registered members resolved when read) resolves it
    now; a method comes back bound to the real object through a recorder of
    its calls. Otherwise the release's.

    A module-level function reaching the release's through a global, not a
    closure: Dynamo, tracing a read of a fake, guards on the closure of the
    class's ``__getattribute__``, and the real object the guard meets at run
    time has object's (AttributeError: 'method-wrapper' object has no
    attribute '__func__')."""
    original = _release_getattribute
    import torch

    if torch.compiler.is_dynamo_compiling() or name in _FAKE_OWN or name.startswith("__"):
        return original(self, name)
    recording = current()
    if recording is None:
        return original(self, name)
    real = object.__getattribute__(self, "__dict__").get("real_obj")
    if not _use_real(real, name):
        return original(self, name)
    try:
        value = original(self, name)
    except AttributeError:
        # what Python does next (the lazy members' __getattr__, which
        # resolves a registered member), done here so that this read is
        # recorded too
        getattr_ = getattr(type(self), "__getattr__", None)
        if getattr_ is None:
            raise
        value = getattr_(self, name)
    if inspect.ismethod(value) or isinstance(
        value, (types.MethodWrapperType, types.BuiltinMethodType)
    ):
        return types.MethodType(_method_recorder(name, value), real)
    recording.read(real, ("attr", name), value)
    return value


def _use_real(real: Any, name: str) -> bool:
    from torch._library import opaque_object as oo

    if real is None or not is_registered_opaque_type(type(real)):
        return False
    return oo.get_member_type(type(real), name) is oo.MemberType.USE_REAL


POINTS = [
    PatchPoint(
        name="aot_autograd.autograd_cache_key.opaque_reads",
        target="torch._functorch._aot_autograd.autograd_cache:autograd_cache_key",
        build=_build_autograd_cache_key,
        reason="AOTAutogradCache reused a graph whose tracing read other values off an "
        "opaque input (a recompile in one process; ranks sharing a cache)",
        upstream_fix=FIX,
        series_none=SERIES_NONE,
        # fail without the record being made and checked
        guarded_by=(
            "test/points/test_opaque_reads.py::TestOpaqueReadsInCaches::test_recompile_on_member_value_gets_its_own_artifact",
            "test/points/test_opaque_reads.py::TestOpaqueReadsInCaches::test_plain_member_read_in_dispatch",
            "test/distributed/test_dtensor_scenarios.py::TestOpaqueReadsRanks::test_redistribute_warm_shared_cache",
            "test/distributed/test_physicsnemo_shard_tensor.py::TestShardTensorWarmLaunch::test_warm_launch_shared_cache",
        ),
        **upstream_fix(*BROKEN_ON),
    ),
    PatchPoint(
        name="aot_autograd.AOTAutogradCache.save.opaque_reads",
        # it saves the recording the cache key point started, with the reads
        # the __getattribute__ point made into it
        requires=(
            "aot_autograd.autograd_cache_key.opaque_reads",
            "library.FakeScriptObject.__getattribute__.opaque_reads",
        ),
        target="torch._functorch._aot_autograd.autograd_cache:AOTAutogradCache.save",
        build=_build_save,
        reason="a cache entry carries the opaque member reads its graph was traced with",
        upstream_fix=FIX,
        series_none=SERIES_NONE,
        # fail without the record being saved (every entry then misses)
        guarded_by=(
            "test/points/test_opaque_reads.py::TestOpaqueReadsInCaches::test_equal_member_values_hit_in_a_warm_process",
        ),
        **upstream_fix(*BROKEN_ON),
    ),
    PatchPoint(
        name="library.FakeScriptObject.__getattribute__.opaque_reads",
        target="torch._library.fake_class_registry:FakeScriptObject.__getattribute__",
        build=_build_fake_getattribute,
        reason="the USE_REAL members tracing reads off an opaque's fake are recorded "
        "for the AOTAutograd cache",
        upstream_fix=FIX,
        series_none=SERIES_NONE,
        # fail without the fake's reads reaching the record
        guarded_by=(
            "test/points/test_opaque_reads.py::TestOpaqueReadsInCaches::test_recompile_on_member_value_gets_its_own_artifact",
            "test/points/test_opaque_reads.py::TestOpaqueReadsInCaches::test_plain_member_read_in_dispatch",
            "test/distributed/test_dtensor_scenarios.py::TestOpaqueReadsRanks::test_redistribute_warm_shared_cache",
            "test/distributed/test_physicsnemo_shard_tensor.py::TestShardTensorWarmLaunch::test_warm_launch_shared_cache",
        ),
        **upstream_fix(*BROKEN_ON),
    ),
    PatchPoint(
        name="inductor.GuardedCache.iterate_over_candidates.opaque_reads",
        target="torch._inductor.codecache:GuardedCache.iterate_over_candidates",
        build=_build_iterate_over_candidates,
        reason="an AOTAutogradCache entry whose recorded opaque member reads differ on "
        "this call's objects was a hit",
        upstream_fix=FIX,
        series_none=SERIES_NONE,
        # fail without the record being made and checked
        guarded_by=(
            "test/points/test_opaque_reads.py::TestOpaqueReadsInCaches::test_recompile_on_member_value_gets_its_own_artifact",
            "test/points/test_opaque_reads.py::TestOpaqueReadsInCaches::test_plain_member_read_in_dispatch",
            "test/distributed/test_dtensor_scenarios.py::TestOpaqueReadsRanks::test_redistribute_warm_shared_cache",
            "test/distributed/test_physicsnemo_shard_tensor.py::TestShardTensorWarmLaunch::test_warm_launch_shared_cache",
        ),
        **upstream_fix(*BROKEN_ON),
    ),
]
