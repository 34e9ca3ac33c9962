"""torch.export saves and loads value opaques passed to graph nodes (upstream issue 179870).

Upstream issue 179870 (open; PR 181676 unmerged), carried into torch 2.12.x,
2.13.0 and 2.14.x (native+fixes, forced): serializing and packaging an
exported program whose constants include an opaque object. See Note
[Upstream fixes] in ``points/__init__.py``.

Releases and modes: 2.12.0, 2.12.1, 2.13.0, 2.14.0, 2.14.1 (forced,
    native+fixes).
Series commits: none.
Upstream: issue 179870 (open; PR 181676 unmerged).
"""

from __future__ import annotations

import contextvars
import functools
import json
import os
import pickle
import sys

from .._torch_compat import is_value_opaque_type
from ..patching.registry import PatchPoint
from ._versions import upstream_fix


_SERDE_FIX = "issue 179870 (open; PR 181676 unmerged)"


#: value opaques reach torch.export from 2.12 on; 2.11 has nothing to save
_SERDE_NO_SERIES = (
    "torch.export of a value opaque passed to a graph node needs torch >= 2.12, "
    "so the point does not apply to 2.11.0 and the v2.11.0 series has no counterpart"
)


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


POINTS = [
    PatchPoint(
        name="export.GraphModuleSerializer.serialize_input.opaque_constant",
        target="torch._export.serde.serialize:GraphModuleSerializer.serialize_input",
        build=_build_serialize_opaque_constant_input,
        reason="a value opaque passed to a graph node could not be serialized (2.12.x) "
        "or was left out of the saved archive (2.13.0, 2.14.x)",
        upstream_fix=_SERDE_FIX,
        series_none=_SERDE_NO_SERIES,
        guarded_by=(
            "test/points/test_export_opaque_constants.py::TestExportOpaqueConstants::test_export_save_load_opaque_constant",
        ),
        **upstream_fix("2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1"),
    ),
    PatchPoint(
        name="export._package_exported_programs.opaque_constant",
        target="torch.export.pt2_archive._package:_package_exported_programs",
        build=_build_package_opaque_constants,
        reason="torch.export.save dropped the value opaques a graph passes to its nodes",
        upstream_fix=_SERDE_FIX,
        series_none=_SERDE_NO_SERIES,
        guarded_by=(
            "test/points/test_export_opaque_constants.py::TestExportOpaqueConstants::test_export_save_load_opaque_constant",
        ),
        **upstream_fix("2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1"),
    ),
    PatchPoint(
        name="export._load_exported_programs.opaque_constant",
        target="torch.export.pt2_archive._package:_load_exported_programs",
        build=_build_load_opaque_constants,
        reason="torch.export.load could not read the value opaques saved by the point above",
        upstream_fix=_SERDE_FIX,
        series_none=_SERDE_NO_SERIES,
        guarded_by=(
            "test/points/test_export_opaque_constants.py::TestExportOpaqueConstants::test_export_save_load_opaque_constant",
        ),
        **upstream_fix("2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1"),
    ),
]
