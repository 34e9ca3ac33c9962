"""Later upstream fixes for opaque objects in subclasses, carried into the
releases that lack them.

Native torch 2.12.0 / 2.12.1 / 2.13.0 / 2.14.0 / 2.14.1 support opaque attrs in
``__tensor_flatten__`` but shipped bugs in the feature that upstream fixed
only later. ``install()`` on those releases applies exactly the points below
that list the release (mode "native+fixes"); forced mode on 2.13.0 carries
them too, and where the bug is also in the 2.11 backport the point lists
2.11.0 (mode "backport") and the patch series carries the same fix.

Each point is a wrapper that handles the one case the fix is about and
delegates everything else to the function it wraps, so it also stacks on
the 2.11 backport's own replacement of the same function (see
``registry.plan``); the issue 179870 archive writer is the exception, a
short function rewritten whole (its docstring says why). ``upstream_fix`` names the upstream PR; the test that
reproduces the bug on every affected release is in
``test/points/test_upstream_fixes.py``.

Issue 187041 (a value opaque that is subclass metadata and is also stored
through a side effect reaches the side effect as a FakeScriptObject;
2.12.0, 2.12.1, 2.13.0) has no point of its own. Upstream's PR 187057 unwraps the
FakeScriptObject in Dynamo's bytecode codegen. On these releases that
object only exists because AOTAutograd turned the value opaque into a
FakeScriptObject constant next to a subclass output, which the PR 193190
point below prevents; with it applied, a codegen point receives no
FakeScriptObject in any case we could build, so no test would fail
without it, and it is not carried. The issue's test is guarded by the
193190 point.

Three points here fix torch 2.10.0 / 2.11.0 bugs *outside* the feature that
block parity with native 2.13 for subclasses written the way users write
them (see "Upstream fixes outside the feature" below).
"""

from __future__ import annotations

import contextvars
import functools
import json
import os
import pickle
import sys

from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .._torch_compat import is_registered_opaque_object, is_value_opaque_type
from ..patching.source_edit import Edit, edited_function

_MISSING = object()


def _build_callable_value_opaque_getattr(original):
    @functools.wraps(original)
    def dynamic_getattr(self, tx, name):
        """Stands in for ``TensorVariable.dynamic_getattr`` (torch 2.12.x,
        2.13.0, 2.14.x; on 2.11.0 it wraps the backport's edited copy).

        Differs: an attribute of an intermediate subclass (no source) that is
        a *callable* value-type opaque (a quantizer with ``__call__``) is
        built like a non-callable one, as a constant opaque variable whose
        methods can be called (upstream PR 188799). Those releases only
        accept non-callable metadata there, so ``y.q.method()`` graph-broke.
        """
        if not self.source:
            fake_val = self.proxy.node.meta.get("example_value")
            if is_traceable_wrapper_subclass(fake_val):
                attrs, _ctx = fake_val.__tensor_flatten__()
                if name not in attrs:
                    value = getattr(fake_val, name, _MISSING)
                    if (
                        value is not _MISSING
                        and callable(value)
                        and is_value_opaque_type(type(value))
                    ):
                        from torch._dynamo.variables.base import VariableTracker

                        return VariableTracker.build(tx, value)
        return original(self, tx, name)

    return dynamic_getattr


def _build_value_opaque_outputs_stay_constants(original):
    @functools.wraps(original)
    def unwrap_tensor_subclasses(wrapped_args, *args, **kwargs):
        """Stands in for ``subclass_utils.unwrap_tensor_subclasses`` (torch
        2.12.x, 2.13.0, 2.14.x; in forced mode it wraps our runtime's copy).

        Differs: a value-type opaque among the values to flatten (a plain
        graph output next to a subclass output) stays the real object.
        Those releases turn every registered opaque into a FakeScriptObject
        here, which is right for reference opaques (graph inputs) but makes a
        value opaque an untracked constant: the graph returns it through a
        ``get_attr`` of a FakeScriptObject, which Python code then sees
        (corrupted) and which an FX-graph-cache entry stores as None (lost
        on a cache hit). Kept real, it is printed into the graph as the
        constant it is (upstream PR 193190).
        """
        from torch._library.fake_class_registry import FakeScriptObject

        values = {
            id(v): v
            for v in wrapped_args
            if not isinstance(v, FakeScriptObject)
            and is_value_opaque_type(type(v))
        }
        result = original(wrapped_args, *args, **kwargs)
        if not values:
            return result

        def keep_real(x):
            if isinstance(x, FakeScriptObject):
                real = object.__getattribute__(x, "real_obj")
                if values.get(id(real)) is real:
                    return real
            return x

        if isinstance(result, tuple):  # (flat args, descriptors) on >= 2.12
            return ([keep_real(x) for x in result[0]], *result[1:])
        return [keep_real(x) for x in result]

    return unwrap_tensor_subclasses


# --------------------------------------------------------------------------
# issue 179870 (open upstream): torch.export.save / torch.export.load of a
# program whose graph passes a value-type opaque to a node. Three points:
# the serializer names the object, the archive writer stores it, the archive
# reader reads it back; the writer's docstring says how and why.

#: record name prefix, under the archive's constants directory, of a pickled
#: value-type opaque graph argument (why it is not torch's own: the writer)
OPAQUE_CONSTANT_PREFIX = "torch_subclass_rt_opaque_value_"

#: while _package_exported_programs serializes one program: the value-type
#: opaque arguments the serializer named, name -> object
_SAVING: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "tsrt_saving_opaque_constants", default=None
)


def _build_serialize_opaque_constant_input(original):
    @functools.wraps(original)
    def serialize_input(self, arg, *args, **kwargs):
        """Stands in for ``GraphModuleSerializer.serialize_input`` of
        ``torch._export.serde.serialize`` (torch 2.12.x, 2.13.0, 2.14.x).

        Differs for a value-type opaque argument only: it becomes a custom
        object argument named ``_custom_obj_N`` and is kept in
        ``self.custom_objs``, as 2.13.0/2.14.x do (2.12.x raised "Unsupported
        argument type"), and is also recorded for the archive writer below,
        which the releases never hand it to.
        """
        from torch._library.fake_class_registry import FakeScriptObject

        if not isinstance(arg, FakeScriptObject) and is_value_opaque_type(type(arg)):
            from torch._export.serde.schema import Argument, CustomObjArgument
            from torch._library.opaque_object import get_opaque_type_name

            name = f"_custom_obj_{len(self.custom_objs)}"
            self.custom_objs[name] = arg
            saving = _SAVING.get()
            if saving is not None:
                saving[name] = arg
            return Argument.create(
                as_custom_obj=CustomObjArgument(name, get_opaque_type_name(type(arg)))
            )
        return original(self, arg, *args, **kwargs)

    return serialize_input


def _build_package_opaque_constants(original):
    @functools.wraps(original)
    def _package_exported_programs(
        archive_writer, exported_programs, opset_version=None, pickle_protocol=None
    ):
        """Stands in for ``_package_exported_programs`` of
        ``torch.export.pt2_archive._package`` (torch 2.12.x, 2.13.0, 2.14.x;
        the same function in all three).

        Differs: each program is serialized before its constants table is
        written, and the value-type opaque objects its graph passes to nodes
        (``_custom_obj_N``, which the releases leave out of the archive)
        are added to that table, pickled, as ``OPAQUE_CONSTANT_PREFIX``
        records. The records and their order are otherwise the release's:
        a program without such an argument is written exactly as before.

        Why: export keeps a value opaque in the graph as a literal argument
        (it is not in ``ep.constants``, which is all the releases' writer
        stores), so the archive named an object it did not contain and
        load failed (issue 179870). Upstream's unmerged PR 181676 pickles
        it; its review asked whether exported programs, meant to load
        without Python, should carry pickles at all. Pickle it is here too
        (a value opaque is a Python object; its ``__fx_repr__`` is Python
        source, no better), but under a record kind of our own rather than
        torch's ``custom_obj_``/``opaque_obj_`` ones, so that:

        * an archive with such an object is refused by every loader that
          has not opted in (stock torch of any release; C++ readers of the
          archive): its constants table names a record kind they do not
          know, and ``torch.export.load`` fails at once, the logged cause
          reading "Unsupported constant type:
          torch_subclass_rt_opaque_value_0". It never loads the graph with
          the object missing or unpickles what torch's format does not
          define, and a format upstream may settle on later is not
          mistaken for this one;
        * only a loader with ``install()`` unpickles it (the reader point
          below), and only value-type opaques are written so: compared by
          ``__eq__``, a copy is the same constant. Reference-type opaques
          (identity matters) stay as each release has them: lifted into
          ``ep.constants`` from module attributes (2.13.0/2.14.1 pickle
          those themselves, 2.12.1 refuses them), refused as program inputs.
        """
        from torch.export import ExportedProgram

        pkg = sys.modules[original.__module__]
        if pickle_protocol is None:
            pickle_protocol = pkg.DEFAULT_PICKLE_PROTOCOL
        if isinstance(exported_programs, ExportedProgram):
            exported_programs = {"model": exported_programs}
        if not isinstance(exported_programs, dict):  # None, or the release's error
            return original(archive_writer, exported_programs, opset_version, pickle_protocol)

        for model_name, ep in exported_programs.items():
            weights = pkg._package_state_dict(model_name, ep, archive_writer, pickle_protocol)
            pkg._package_payload_config(
                archive_writer, weights, pkg.WEIGHTS_CONFIG_FILENAME_FORMAT.format(model_name)
            )
            opaque: dict = {}
            token = _SAVING.set(opaque)
            try:
                artifact = pkg.serialize(
                    ep, opset_version, pickle_protocol,
                    serialize_state_dict=False, serialize_constants=False,
                )
            finally:
                _SAVING.reset(token)
            constants = pkg._package_constants(model_name, ep, archive_writer, pickle_protocol)
            if opaque:
                from torch._export.serde.schema import PayloadMeta

                prefix = os.path.join(pkg.CONSTANTS_DIR, OPAQUE_CONSTANT_PREFIX)
                index = archive_writer.count_prefix(prefix)
                for name, obj in opaque.items():
                    path_name = f"{OPAQUE_CONSTANT_PREFIX}{index}"
                    index += 1
                    archive_writer.write_bytes(
                        os.path.join(pkg.CONSTANTS_DIR, path_name),
                        pickle.dumps(obj, protocol=pickle_protocol),
                    )
                    constants.config[name] = PayloadMeta(
                        path_name=path_name, is_param=False, use_pickle=True, tensor_meta=None
                    )
            pkg._package_payload_config(
                archive_writer, constants, pkg.CONSTANTS_CONFIG_FILENAME_FORMAT.format(model_name)
            )
            archive_writer.write_bytes(
                pkg.MODELS_FILENAME_FORMAT.format(model_name), artifact.exported_program
            )
            archive_writer.write_bytes(
                pkg.SAMPLE_INPUTS_FILENAME_FORMAT.format(model_name), artifact.example_inputs
            )

    return _package_exported_programs


class _ArchiveWithoutOpaqueConstants:
    """An archive reader whose constants tables read without the
    ``OPAQUE_CONSTANT_PREFIX`` records (the release's ``_load_constants``
    refuses record kinds it does not know); everything else is the reader's."""

    def __init__(self, reader, tables: dict[str, str]) -> None:
        self._reader = reader
        self._tables = tables

    def read_string(self, name: str) -> str:
        if name in self._tables:
            return self._tables[name]
        return self._reader.read_string(name)

    def __getattr__(self, name: str):
        return getattr(self._reader, name)


def _build_load_opaque_constants(original):
    @functools.wraps(original)
    def _load_exported_programs(archive_reader, file_names, expected_opset_version):
        """Stands in for ``_load_exported_programs`` of
        ``torch.export.pt2_archive._package`` (torch 2.12.x, 2.13.0, 2.14.x;
        the same function in all three).

        Differs only for an archive whose constants tables hold
        ``OPAQUE_CONSTANT_PREFIX`` records (any other goes to the release's
        function): those objects are unpickled here and given to the
        deserializer with the constants the release's ``_load_constants``
        reads (from a view of the archive without them), then taken out of
        the loaded program's ``constants``: they are graph literals, as in
        the program that was saved, and a program saved again must not
        carry them twice.
        """
        from torch._export.serde import schema
        from torch._export.serde.serialize import (
            ExportedProgramDeserializer,
            _bytes_to_dataclass,
        )

        pkg = sys.modules[original.__module__]
        head, tail = pkg.MODELS_FILENAME_FORMAT.split("{}")
        models = [
            f[len(head) : -len(tail)]
            for f in file_names
            if f.startswith(pkg.MODELS_DIR) and f.endswith(tail)
        ]
        tables: dict[str, str] = {}
        opaque: dict[str, dict[str, str]] = {}
        for model_name in models:
            config_file = pkg.CONSTANTS_CONFIG_FILENAME_FORMAT.format(model_name)
            if config_file not in file_names:
                continue
            config = json.loads(archive_reader.read_string(config_file))
            entries = config.get("config", {})
            ours = {
                fqn: meta["path_name"]
                for fqn, meta in entries.items()
                if meta.get("path_name", "").startswith(OPAQUE_CONSTANT_PREFIX)
            }
            if ours:
                config["config"] = {k: v for k, v in entries.items() if k not in ours}
                tables[config_file] = json.dumps(config)
                opaque[model_name] = ours
        if not opaque:
            return original(archive_reader, file_names, expected_opset_version)

        view = _ArchiveWithoutOpaqueConstants(archive_reader, tables)
        programs = {}
        for model_name in models:
            serialized = _bytes_to_dataclass(
                schema.ExportedProgram,
                archive_reader.read_bytes(pkg.MODELS_FILENAME_FORMAT.format(model_name)),
            )
            state_dict = pkg._load_state_dict(archive_reader, model_name)
            constants = pkg._load_constants(view, model_name)
            ours = opaque.get(model_name, {})
            for fqn, path_name in ours.items():
                constants[fqn] = pickle.loads(
                    archive_reader.read_bytes(os.path.join(pkg.CONSTANTS_DIR, path_name))
                )
            ep = ExportedProgramDeserializer(expected_opset_version).deserialize(
                serialized,
                state_dict,
                constants,
                archive_reader.read_bytes(pkg.SAMPLE_INPUTS_FILENAME_FORMAT.format(model_name)),
            )
            for fqn in ours:
                ep.constants.pop(fqn, None)
            programs[model_name] = ep
        return programs

    return _load_exported_programs


def _build_registered_opaque_instancecheck(original):
    from torch._opaque_base import OpaqueBase

    def __instancecheck__(cls, instance):
        """Stands in for ``torch._opaque_base.OpaqueBaseMeta.__instancecheck__``
        (torch 2.12.0, 2.12.1).

        Differs for ``isinstance(x, OpaqueBase)`` only: an instance of any
        registered opaque type, or a FakeScriptObject of one, is an opaque
        object, as on torch >= 2.13 (upstream PR 180530). Those releases
        register the pybind ``ProcessGroup`` as a reference opaque (its
        metaclass is ``OpaqueBaseMeta``) but check the base nominally, and it
        does not derive from ``OpaqueBase``: every "expected Tensor or
        OpaqueBase" check of AOTAutograd refused a process group among a
        subclass's inner attrs. A concrete subclass keeps the release's check.
        """
        if original(cls, instance):
            return True
        return cls is OpaqueBase and is_registered_opaque_object(instance)

    return __instancecheck__



# --------------------------------------------------------------------------
# Upstream fixes outside the feature (torch 2.10.0 / 2.11.0)
#
# Note [Scope of the fixes outside the feature]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
#     These bugs are torch 2.10/2.11's own, not the backport's: the logging
#     one breaks a subclass without a ``__repr__`` of its own whether or not
#     it holds an opaque (stock 2.10/2.11 fail alike), and the donated-buffer
#     one can only see an opaque because 2.11 saves opaques for backward.
#     They are carried for every graph, not only for graphs with an opaque:
#     each changes what torch does only where stock torch raises (the first
#     formats lazily what it formatted eagerly for a log record nobody
#     reads; the second skips what is not a tensor), native 2.12+ behave
#     that way for all graphs, and keeping a crash for graphs without an
#     opaque would make ``install()`` worse than the release it fixes. So
#     they are the named exception to Note [install() is transparent without
#     opaques] (runtime/__init__.py): a test that fails stock
#     with the logging bug passes with ``install()``, which
#     ``python -m torch_subclass_rt compare`` reports as fixed by
#     ``install()``, apart from the tests it breaks (none).
#     Not carried: with a handler on the structured-trace log (TORCH_TRACE,
#     tlparse, pytest's log capture) every release through 2.13 formats the
#     same metadata for the trace and fails alike; upstream PR 185632
#     (issue 152183) makes the repr itself safe, after 2.13.


def _lazy_metadata_log_edits(*names: str) -> list[Edit]:
    # "str(x)," -> "x,": the logger formats the argument only when the
    # record is emitted, as torch 2.12 does
    return [Edit(f"str({n}),", f"{n},") for n in names]


def _build_lazy_fw_bw_log(original):
    """``graph_compile._log_fw_bw_graphs`` (torch 2.10.0, 2.11.0) from
    torch's source, with the arguments of its ``aot_graphs_log.info``
    metadata record passed as objects instead of ``str()``-ed first.

    Why: the dataclass repr of ``ViewAndMutationMeta`` prints the traced
    tangents, fake subclass instances, with ``Tensor.__repr__`` when the
    subclass defines no ``__repr__``; that reads tensor data and raises
    ``GuardOnDataDependentSymNode`` (``_tensor_str.py``) while compiling
    the backward, with the log off. Torch 2.12 passes the objects and
    formats only an emitted record (with ``TORCH_LOGS=aot_graphs`` 2.12/2.13
    still fail the same way; upstream PR 185632 makes the repr itself safe).
    Note [Scope of the fixes outside the feature].
    """
    return edited_function(
        original,
        _lazy_metadata_log_edits(
            "aot_config.aot_id",
            "fw_metadata",
            "_get_inner_meta(maybe_subclass_meta, fw_metadata)",
        ),
    )


def _build_lazy_base_graph_log(original):
    """``graph_capture.aot_dispatch_base_graph`` (torch 2.10.0, 2.11.0)
    from torch's source, with its ``aot_graphs_log.debug`` metadata record's
    arguments passed as objects instead of ``str()``-ed first, as torch 2.12
    does: the inference-graph counterpart of :func:`_build_lazy_fw_bw_log`
    (the subclass metadata's ``original_subclass`` is printed with
    ``Tensor.__repr__``). Note [Scope of the fixes outside the feature].
    """
    return edited_function(
        original,
        _lazy_metadata_log_edits("aot_config.aot_id", "fw_metadata", "maybe_subclass_meta"),
    )


def _build_donated_buffers_skip_opaques(original):
    @functools.wraps(original)
    def collect_fw_donated_buffer_idxs(fw_ins, user_fw_outs, bw_outs, saved_tensors):
        """Stands in for ``graph_compile.collect_fw_donated_buffer_idxs``
        (torch 2.10.0, 2.11.0).

        Differs: a saved value that is not a ``FakeTensor`` (an opaque's
        FakeScriptObject) is never a donated buffer; torch 2.13 checks the
        same. The releases read ``.untyped_storage()`` off it: the
        FakeScriptObject has no such member, and the compile fails. The
        saved slice it is handed can hold an opaque: the inner metadata
        counts a mutated subclass input as one forward output while the
        graph returns its flattened attrs, opaques included (native 2.13
        miscounts alike, and skips the opaque by this check).
        Note [Scope of the fixes outside the feature].
        """
        from torch._subclasses.fake_tensor import FakeTensor

        saved = [t if isinstance(t, FakeTensor) else None for t in saved_tensors]
        return original(fw_ins, user_fw_outs, bw_outs, saved)

    return collect_fw_donated_buffer_idxs


_USER_TESTS = "test/runtime/test_user_written_subclasses.py::"
_NO_REPR_TESTS = tuple(
    f"{_USER_TESTS}TestNoReprSubclass::test_{name}"
    for name in (
        "train_device_mesh_aot_eager",
        "train_device_mesh_inductor",
        "other_dim_names_recompile",
        "train_handle_aot_eager",
        "train_handle_inductor",
        "train_without_opaque_aot_eager",
        "train_without_opaque_inductor",
    )
)
_NO_REPR_INFERENCE_TESTS = tuple(
    f"{_USER_TESTS}TestNoReprSubclass::test_{name}"
    for name in (
        "inference_device_mesh_aot_eager",
        "inference_device_mesh_inductor",
        "inference_handle_inductor",
        "inference_without_opaque_inductor",
    )
)
_DONATED_TESTS = (
    f"{_USER_TESTS}TestDonatedBuffers::test_mutated_detached_view_of_nested_input",
    f"{_USER_TESTS}TestDonatedBuffers::test_mutated_detached_view_one_level",
)
