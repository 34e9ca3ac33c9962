"""``isinstance`` of a ProcessGroup inner attr in compiled code (2.10 / 2.11).

Series commit 0027 ("[dynamo] isinstance of a fake DeviceMesh / ProcessGroup
answers by the class it reports").

Releases and modes: 2.10.0, 2.11.0 (backport).
Series commits:
    patches/v2.10.0/0027-dynamo-isinstance-of-a-fake-DeviceMesh-ProcessGroup-.patch,
    patches/v2.11.0/0027-dynamo-isinstance-of-a-fake-DeviceMesh-ProcessGroup-.patch.
Upstream: none needed: torch >= 2.12 gives ``ProcessGroup`` the
    ``OpaqueBaseMeta`` metaclass, whose ``__instancecheck__`` Dynamo calls.

A ProcessGroup among a subclass's inner attrs reaches Dynamo as a
``TorchScriptObjectVariable`` holding a ``FakeScriptObject``. Library code
the compiled function inlines asks ``isinstance(group, dist.ProcessGroup)``:
functional collectives resolve their group so
(``funcol.all_reduce(t, "sum", x.pg)``). Dynamo answers with
``issubclass(vt.python_type(), ProcessGroup)``, and the type is
FakeScriptObject: False, so ``_resolve_group_name`` raised "Unsupported group
type: <class '...FakeScriptObject'>" inside Dynamo, which fell back to eager
(``fullgraph=True``: "Observed exception"). Native 2.13 compiles one graph.
A DeviceMesh attr worked already: 2.11's ``DeviceMesh`` has the
``OpaqueBaseMeta`` metaclass (2.10's the package's), whose
``__instancecheck__`` Dynamo calls on the fake, and the fake reports its
real object's class (Note [isinstance of a fake DeviceMesh] in
``distributed_opaques``). The pybind ``ProcessGroup``'s metaclass cannot be
swapped, so the answer is given where Dynamo evaluates the call.
"""

from __future__ import annotations

import functools

from ..patching.registry import PatchPoint
from ._versions import ONLY_BACKPORT
from .distributed_opaques import fake_class


def fake_isinstance(arg, classinfo_vt):
    """``isinstance(<fake DeviceMesh / ProcessGroup>, classinfo)`` as the
    real object answers it, or None where another rule applies (another
    object, or a classinfo that is not a constant)."""
    from torch._dynamo.variables.script_object import TorchScriptObjectVariable
    from torch._library.fake_class_registry import FakeScriptObject

    if not isinstance(arg, TorchScriptObjectVariable):
        return None
    fake = arg.value
    if not isinstance(fake, FakeScriptObject) or fake_class(fake) is None:
        return None
    try:
        classinfo = classinfo_vt.as_python_constant()
    except NotImplementedError:
        return None
    try:
        # Python's isinstance falls back to the fake's __class__ (its real
        # object's class) where type(fake) does not match
        return isinstance(fake, classinfo)
    except TypeError:
        return None


def _build_call_function(original):
    @functools.wraps(original)
    def call_function(self, tx, args, kwargs):
        """Wraps ``torch._dynamo.variables.builtin.BuiltinVariable.call_function``
        (torch 2.10.0, 2.11.0).

        Differs: ``isinstance(x, classinfo)`` on a fake DeviceMesh /
        ProcessGroup answers as its real object (``isinstance(pg,
        dist.ProcessGroup)`` is True), instead of by ``python_type()``,
        FakeScriptObject. ``call_isinstance`` is where torch evaluates the
        call, but the handler torch builds for it is cached per argument
        types with that method bound, so a replacement of it would not be
        seen (nor undone) once Dynamo had traced an ``isinstance``; this
        entry point is looked up on every call. Every other call: torch's.
        """
        if self.fn is isinstance and len(args) == 2 and not kwargs:
            answer = fake_isinstance(args[0].realize(), args[1])
            if answer is not None:
                from torch._dynamo.variables.constant import ConstantVariable

                return ConstantVariable.create(answer)
        return original(self, tx, args, kwargs)

    return call_function


POINTS = [
    PatchPoint(
        name="dynamo.BuiltinVariable.call_function.fake_isinstance",
        target="torch._dynamo.variables.builtin:BuiltinVariable.call_function",
        build=_build_call_function,
        reason="a ProcessGroup inner attr as a functional collective's group: "
        "isinstance(group, ProcessGroup) was False on its fake, and Dynamo fell back to eager",
        series=(
            "0027 torch/_dynamo/variables/builtin.py::BuiltinVariable.call_isinstance",
        ),
        guarded_by=(
            "test/distributed/test_fake_process_group_isinstance.py::TestFakeProcessGroupIsinstance::test_all_reduce_over_process_group_attr",
            "test/distributed/test_fake_process_group_isinstance.py::TestFakeProcessGroupIsinstance::test_isinstance_of_process_group_attr",
        ),
        **ONLY_BACKPORT,
    ),
]
