"""Two torch 2.10 / 2.11 bugs outside the feature (series 0018).

Series patch 0018 ("Format metadata log records lazily; skip ..."): the
metadata log record formatted eagerly (issue 152183, fixed in torch 2.12.0)
and the donated-buffer analysis reading a saved opaque (torch 2.12.0's
check), carried into 2.10.0 / 2.11.0 for every graph (Note [Scope of the
fixes outside the feature], below).

Releases and modes: 2.10.0, 2.11.0 (backport, native+fixes).
Series commits:
    patches/v2.10.0/0018-aot_autograd-Format-metadata-log-records-lazily-skip.patch.
Upstream: issue 152183 (torch 2.12.0 formats the record lazily; PR 185632
    later makes the repr itself subclass-safe); torch 2.12.0 donated-buffer
    check (a FakeTensor check in collect_fw_donated_buffer_idxs; no upstream
    issue: 2.12 shipped it with opaques saved as graph inputs).
"""

from __future__ import annotations

import functools

from ..patching.registry import PatchPoint
from ..patching.source_edit import Edit, edited_function
from ._versions import upstream_fix


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
        saved slice it was handed held an opaque where the inner metadata
        counted a mutated subclass input as one forward output while the
        graph returns its flattened attrs, opaques included (native 2.13
        miscounts alike, and skips the opaque by this check). Since
        ``donated_buffers_split`` splits where the partitioner did, no
        compile we know of hands it one; the check stays, as in 2.12+, for
        any caller that does (guarded by a direct call:
        ``test_saved_opaque_is_never_donated``).
        Note [Scope of the fixes outside the feature].
        """
        from torch._subclasses.fake_tensor import FakeTensor

        saved = [t if isinstance(t, FakeTensor) else None for t in saved_tensors]
        return original(fw_ins, user_fw_outs, bw_outs, saved)

    return collect_fw_donated_buffer_idxs


POINTS = [
    PatchPoint(
        name="aot_autograd._log_fw_bw_graphs.lazy_metadata_log",
        target="torch._functorch._aot_autograd.graph_compile:_log_fw_bw_graphs",
        build=_build_lazy_fw_bw_log,
        reason="a subclass without __repr__ could not be trained under compile: the "
        "metadata log record was formatted eagerly, printing fake tangents",
        upstream_fix="issue 152183 (torch 2.12.0 formats the record lazily; PR 185632 "
        "later makes the repr itself subclass-safe)",
        series=("0018 torch/_functorch/_aot_autograd/graph_compile.py::_log_fw_bw_graphs",),
        guarded_by=(
            "test/points/test_lazy_log_and_donated_buffers.py::TestMetadataNotFormattedUnheard::test_training_record_not_formatted",
            "test/points/test_lazy_log_and_donated_buffers.py::TestNoReprSubclass::test_train_device_mesh_aot_eager",
            "test/points/test_lazy_log_and_donated_buffers.py::TestNoReprSubclass::test_train_device_mesh_inductor",
            "test/points/test_lazy_log_and_donated_buffers.py::TestNoReprSubclass::test_other_dim_names_recompile",
            "test/points/test_lazy_log_and_donated_buffers.py::TestNoReprSubclass::test_train_handle_aot_eager",
            "test/points/test_lazy_log_and_donated_buffers.py::TestNoReprSubclass::test_train_handle_inductor",
            "test/points/test_lazy_log_and_donated_buffers.py::TestNoReprSubclass::test_train_without_opaque_aot_eager",
            "test/points/test_lazy_log_and_donated_buffers.py::TestNoReprSubclass::test_train_without_opaque_inductor",
        ),
        **upstream_fix("2.10.0", "2.11.0"),
    ),
    PatchPoint(
        name="aot_autograd.aot_dispatch_base_graph.lazy_metadata_log",
        target="torch._functorch._aot_autograd.graph_capture:aot_dispatch_base_graph",
        build=_build_lazy_base_graph_log,
        reason="a subclass without __repr__ could not be compiled for inference: the "
        "metadata log record was formatted eagerly, printing fake subclasses",
        upstream_fix="issue 152183 (torch 2.12.0 formats the record lazily; PR 185632 "
        "later makes the repr itself subclass-safe)",
        series=("0018 torch/_functorch/_aot_autograd/graph_capture.py::aot_dispatch_base_graph",),
        rebinds=("torch._functorch._aot_autograd.graph_compile",),
        guarded_by=(
            "test/points/test_lazy_log_and_donated_buffers.py::TestMetadataNotFormattedUnheard::test_inference_record_not_formatted",
            "test/points/test_lazy_log_and_donated_buffers.py::TestNoReprSubclass::test_inference_device_mesh_aot_eager",
            "test/points/test_lazy_log_and_donated_buffers.py::TestNoReprSubclass::test_inference_device_mesh_inductor",
            "test/points/test_lazy_log_and_donated_buffers.py::TestNoReprSubclass::test_inference_handle_inductor",
            "test/points/test_lazy_log_and_donated_buffers.py::TestNoReprSubclass::test_inference_without_opaque_inductor",
        ),
        **upstream_fix("2.10.0", "2.11.0"),
    ),
    PatchPoint(
        name="aot_autograd.collect_fw_donated_buffer_idxs.skip_opaques",
        target="torch._functorch._aot_autograd.graph_compile:collect_fw_donated_buffer_idxs",
        build=_build_donated_buffers_skip_opaques,
        reason="the donated-buffer analysis read untyped_storage() off a saved opaque",
        upstream_fix="torch 2.12.0 donated-buffer check (a FakeTensor check in "
        "collect_fw_donated_buffer_idxs; no upstream issue: 2.12 shipped it with opaques "
        "saved as graph inputs)",
        series=(
            "0018 torch/_functorch/_aot_autograd/graph_compile.py::collect_fw_donated_buffer_idxs",
        ),
        guarded_by=(
            "test/points/test_lazy_log_and_donated_buffers.py::TestDonatedBuffers::test_mutated_detached_view_of_nested_input",
            "test/points/test_lazy_log_and_donated_buffers.py::TestDonatedBuffers::test_mutated_detached_view_one_level",
            "test/points/test_lazy_log_and_donated_buffers.py::TestDonatedBuffers::test_saved_opaque_is_never_donated",
        ),
        **upstream_fix("2.10.0", "2.11.0"),
    ),
]
