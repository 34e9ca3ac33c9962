"""A submesh derived in traced code from a mesh graph input.

Series patch 0016 ("[distributed][fx] Derive a submesh of a mesh graph
input"), and on torch 2.11 the partitioners' case of a real opaque saved
for backward (0023).

Releases and modes: 2.10.0, 2.11.0 (backport).
Series commits:
    patches/v2.10.0/0016-distributed-fx-Derive-a-submesh-of-a-mesh-graph-inpu.patch,
    patches/v2.11.0/0023-fx-functorch-A-real-opaque-a-traced-function-returns.patch.
Upstream: none (not an upstream fix).

A submesh derived inside traced code from a mesh graph input (torch 2.10 / 2.11).

torch 2.13 registers ``DeviceMesh`` with a ``reconstruct_fn``: when make_fx
meets a mesh it does not track (``mesh["tp"]`` computed by the traced code
from a mesh that *is* a graph input), its ``PythonKeyTracer.create_arg``
emits ``device_mesh::_get_submesh(ancestor, dims)`` on the tracked ancestor
instead of baking the compile-time submesh into the graph as a constant. So
every call's collectives run on a submesh of that call's mesh, and one
graph serves equal meshes.

torch 2.11 and 2.10 have none of the four pieces; this module gives them
(2.10 with its own variant of the ``default_partition`` edit):

* ``FakeScriptObject.__getitem__`` (new attribute): ``mesh["tp"]`` on the
  fake a ``__torch_dispatch__`` sees while AOTAutograd traces; without it,
  "TypeError: 'FakeScriptObject' object is not subscriptable".
* :func:`reconstruct_fn`: the per-type reconstruction (2.11's
  ``_OpaqueTypeInfo`` has no ``reconstruct_fn`` field; the series adds it,
  so there it is looked up through the registration).
* ``device_mesh::_get_submesh``: the op the reconstruction emits, defined on
  first use (2.13 defines it in ``torch/distributed/_ops/device_mesh.py``).
  2.11's ``infer_schema`` cannot spell an opaque *return*, so the schema is
  written out; the C++ side accepts it since the type name is registered.
  An operator definition is process-wide and stays after ``uninstall()``,
  like the opaque type names ``distributed_opaques`` registers with the C++
  side; without ``install()`` nothing emits it.
* the tracer hook, ``PythonKeyTracer.create_arg``: an untracked opaque
  with a reconstruction becomes a node on the tracked ancestor.
* ``default_partition``: 2.11 asserts that every forward ``call_function``
  node is a tensor ("Expected _get_submesh to be a tensor"); 2.13 sets an
  opaque node aside as a saved value (``is_opaque_node``), which 2.11's
  ``_extract_fwd_bwd_modules`` already orders after the tensors and drops
  when the backward does not use it.

Dynamo needs nothing more: ``__getitem__`` is an ``INLINED`` DeviceMesh
member (Note [Distributed opaque members]), so ``x.mesh["tp"]`` in compiled
code becomes a ``call_method`` node on the mesh input, which AOTAutograd
traces through the ``__getitem__`` above and the hook.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from ..patching.registry import PatchPoint
from ..patching.source_edit import Edit, edited_function
from ._versions import ONLY_2_11, ONLY_BACKPORT, per_release

#: the Library that owns device_mesh::_get_submesh (kept alive: dropping it
#: would deregister the op)
_submesh_library: Any = None


def _get_submesh_impl(mesh: Any, mesh_dims: list[int]) -> Any:
    # the op's kernel and fake kernel alike (a fake mesh subscripts its real one)
    names = mesh._mesh_dim_names
    if names is None:
        raise ValueError(f"Cannot slice mesh without dim names: {mesh}")
    dim_names = tuple(names[i] for i in mesh_dims)
    return mesh[dim_names[0]] if len(dim_names) == 1 else mesh[dim_names]


def submesh_op() -> Any:
    """``torch.ops.device_mesh._get_submesh`` (the packet), defined if
    needed. Called on the packet with a Proxy argument, as 2.13 does, so the
    graph's node target is the same."""
    global _submesh_library
    import torch

    if _submesh_library is None and not hasattr(torch.ops.device_mesh, "_get_submesh"):
        from torch._library.opaque_object import get_opaque_obj_info
        from torch.distributed.device_mesh import DeviceMesh

        name = get_opaque_obj_info(DeviceMesh).class_name
        lib = torch.library.Library("device_mesh", "FRAGMENT")
        lib.define(f"_get_submesh({name} mesh, int[] mesh_dims) -> {name}")
        lib.impl("_get_submesh", _get_submesh_impl, "CompositeExplicitAutograd")
        torch.library.register_fake("device_mesh::_get_submesh", _get_submesh_impl, lib=lib)
        _submesh_library = lib
    return torch.ops.device_mesh._get_submesh


def _reconstruct_submesh(mesh: Any, tracked_proxy: Callable[[Any], Any], tracked: Callable[[], Any]) -> Any:
    """The proxy of ``mesh`` derived from a tracked ancestor, or None.

    Mirrors torch 2.13's ``_device_mesh_reconstruct_fn``
    (``torch/distributed/device_mesh.py``): the root mesh if it is tracked,
    else any tracked mesh with the same root that has all of ``mesh``'s dim
    names. A root mesh, or a mesh without dim names, is not derivable.
    """
    from torch.distributed.device_mesh import DeviceMesh

    root = mesh._get_root_mesh()
    names = mesh._mesh_dim_names
    if mesh is root or names is None:
        return None
    ancestor, proxy = root, tracked_proxy(root)
    if proxy is None:
        for obj, obj_proxy in tracked():
            if not isinstance(obj, DeviceMesh) or obj is mesh or obj._get_root_mesh() is not root:
                continue
            if obj._mesh_dim_names is not None and all(n in obj._mesh_dim_names for n in names):
                ancestor, proxy = obj, obj_proxy
                break
    if proxy is None or ancestor._mesh_dim_names is None:
        return None
    dims = [ancestor._mesh_dim_names.index(n) for n in names]
    # a Proxy argument: Proxy.__torch_function__ records the call
    return submesh_op()(proxy, dims)


def _uncached_reconstruct_fn(cls: type) -> Callable[..., Any] | None:
    from torch.distributed.device_mesh import DeviceMesh

    return _reconstruct_submesh if issubclass(cls, DeviceMesh) else None


_cached_reconstruct_fn = functools.lru_cache(maxsize=256)(_uncached_reconstruct_fn)


def reconstruct_fn(cls: type) -> Callable[..., Any] | None:
    """The reconstruction for instances of ``cls`` (2.13:
    ``torch._library.opaque_object.get_reconstruct_fn``); only DeviceMesh
    has one. Cached per class: the tracer asks for every argument of every
    node it creates, and the answer depends on the class alone."""
    try:
        return _cached_reconstruct_fn(cls)
    except TypeError:  # a class whose metaclass makes it unhashable
        return _uncached_reconstruct_fn(cls)


def fake_getitem(self: Any, key: Any) -> Any:
    """``FakeScriptObject.__getitem__``, absent on torch 2.11.0 (2.13 has
    it, for DeviceMesh): subscripts the real object, so ``mesh["tp"]`` in a
    ``__torch_dispatch__`` gives the compile-time submesh, which the proxy
    tracer then derives from the mesh input (module docstring)."""
    return object.__getattribute__(self, "real_obj")[key]


def _try_reconstruct(tracer: Any, a: Any) -> Any:
    """The node for an untracked opaque ``a`` derived from tracked graph
    inputs, or None (torch 2.13: ``PythonKeyTracer._try_reconstruct_opaque``)."""
    from .._torch_compat import is_registered_opaque_type, unwrap_fake_opaque

    real = unwrap_fake_opaque(a)
    # the class test first: it is cached and rejects every argument that is
    # not a mesh (nodes, ints, lists) before the registry is asked
    fn = reconstruct_fn(type(real))
    if fn is None or not is_registered_opaque_type(type(real)):
        return None

    from torch._library.fake_class_registry import FakeScriptObject

    from .tracing import real_obj_proxies
    side = real_obj_proxies(tracer)

    def tracked():
        for obj, proxy in list(tracer.script_object_tracker.items()):
            if isinstance(obj, FakeScriptObject):
                yield unwrap_fake_opaque(obj), proxy

    def tracked_proxy(obj):
        proxy = side.get(id(obj))
        if proxy is not None:
            return proxy
        # an equal mesh wrapped in a tracked fake (2.13 compares too)
        return next((p for o, p in tracked() if o is not None and o == obj), None)

    result = fn(real, tracked_proxy, tracked)
    if result is None:
        return None
    if "val" not in result.node.meta:
        # a fake, as for an opaque graph input: the partitioner and the
        # saved-for-backward machinery recognise opaques by it
        from torch._guards import detect_fake_mode
        from torch._library.fake_class_registry import maybe_to_fake_obj

        fake = a if isinstance(a, FakeScriptObject) else maybe_to_fake_obj(detect_fake_mode(), real)
        result.node.meta["val"] = fake
    if isinstance(a, FakeScriptObject):
        from torch.fx.experimental.proxy_tensor import set_proxy_slot

        set_proxy_slot(a, tracer, result)
    side.setdefault(id(real), result)
    return result.node


def _build_create_arg(original):
    def create_arg(self, a):
        """Wraps ``torch.fx.experimental.proxy_tensor.PythonKeyTracer.create_arg``
        (torch 2.11.0). Differs from 2.11 as 2.13 does: an opaque the trace
        does not track (a submesh the traced code derived from a mesh
        input) becomes a node deriving it from the tracked input instead of
        a constant. Note [install() is transparent without opaques]:
        delegation (anything that is not a registered opaque with a
        reconstruction goes to torch's create_arg)."""
        node = _try_reconstruct(self, a)
        return node if node is not None else original(self, a)

    return create_arg


def is_opaque_node(node: Any) -> bool:
    """Whether an FX node's value is an opaque (2.13:
    ``torch._functorch._aot_autograd.graph_compile.is_opaque_node``)."""
    import torch
    from torch._library.fake_class_registry import FakeScriptObject

    from .._torch_compat import is_registered_opaque_type

    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    # is_registered_opaque_type(type(val)): 2.11's is_opaque_value, which 2.10 lacks
    return isinstance(val, (torch.ScriptObject, FakeScriptObject)) or is_registered_opaque_type(
        type(val)
    )


def _build_default_partition(original):
    """``torch._functorch.partitioners.default_partition`` (torch 2.11.0)
    with one edit. Differs from 2.11 as 2.13 does: a forward node whose
    value is an opaque (a submesh derived in the forward) is a saved value
    instead of failing "Expected ... to be a tensor". Note [install() is
    transparent without opaques]: identical (torch's own source; the new
    branch is taken only by a node that 2.11 rejects)."""
    return edited_function(
        original,
        [
            Edit(
                """
                if not is_tensor(node) and node.op == "call_function":
                    raise AssertionError(f"Expected {node} to be a tensor")
                """,
                """
                if __tsrt__.is_opaque_node(node):
                    saved_values.append(node)
                    continue
                if not is_tensor(node) and node.op == "call_function":
                    raise AssertionError(f"Expected {node} to be a tensor")
                """,
            ),
        ],
    )


def _build_default_partition_2_10(original):
    """``default_partition`` (torch 2.10.0): the edit of
    :func:`_build_default_partition` on 2.10's spelling of the check (an
    ``assert``; 2.11 raises). Differs from 2.10 as from 2.11."""
    return edited_function(
        original,
        [
            Edit(
                """
                assert is_tensor(node) or node.op != "call_function", (
                """,
                """
                if __tsrt__.is_opaque_node(node):
                    saved_values.append(node)
                    continue
                assert is_tensor(node) or node.op != "call_function", (
                """,
            ),
        ],
    )


def _build_extract_fwd_bwd_modules(original):
    """``torch._functorch.partitioners._extract_fwd_bwd_modules`` (torch
    2.11.0) with one edit. Differs from 2.11 as 2.13 does: a saved value
    that is a *real* registered opaque (the mesh a Dynamo-compiled
    subgraph returns while AOTAutograd traces over it) is a saved opaque
    (``is_opaque_node``), stashed on ctx, not a tensor for
    save_for_backward ("expected all tensors_saved_with_vc_check to be
    Tensors"); 2.11 recognises only fakes. Note [install() is transparent
    without opaques]: identical (torch's own source; without opaques no
    saved value is a FakeScriptObject or registered opaque, and a saved
    ScriptObject, which 2.11 rejects as a non-tensor, is set aside as
    2.13 sets it aside)."""
    return edited_function(
        original,
        [
            Edit(
                """
                if isinstance(node.meta.get("val"), FakeScriptObject):
                    saved_opaque_objects.append(node)
                """,
                """
                if __tsrt__.is_opaque_node(node):
                    saved_opaque_objects.append(node)
                """,
            ),
        ],
    )


def _build_aot_stage2a_partition(original):
    """``torch._functorch._aot_autograd.graph_compile._aot_stage2a_partition``
    (torch 2.11.0) with one edit. Differs from 2.11 as 2.13 does: a real
    registered opaque saved for backward counts in
    ``num_opaque_objects_saved_for_bw`` (``is_opaque_node``), as the
    partition edit above sets it aside with the fakes. Note [install() is
    transparent without opaques]: identical (torch's own source; the edited
    branch is reached only by a node whose value is not a FakeTensor)."""
    return edited_function(
        original,
        [
            Edit(
                """
                    elif isinstance(node.meta["val"], FakeScriptObject):
                        opaque_outs_saved_for_bw.append(node)
                """,
                """
                    elif __tsrt__.is_opaque_node(node):
                        opaque_outs_saved_for_bw.append(node)
                """,
            ),
        ],
    )


POINTS = [
    # torch 2.10's point of this name is torch_2_11_base's
    PatchPoint(
        name="partitioners._extract_fwd_bwd_modules",
        target="torch._functorch.partitioners:_extract_fwd_bwd_modules",
        build=_build_extract_fwd_bwd_modules,
        reason="a real opaque saved for backward went to save_for_backward with the tensors (2.13: is_opaque_node)",
        series=("0023 torch/_functorch/partitioners.py::_extract_fwd_bwd_modules",),
        guarded_by=(
            "test/distributed/test_dtensor_opaque_mesh.py::TestDTensorOpaqueMeshCPU::test_aot_over_dynamo_mesh_output_backward_cpu",
        ),
        **ONLY_2_11,
    ),
    *per_release(
        name="partitioners.default_partition",
        target="torch._functorch.partitioners:default_partition",
        reason="a forward node that is an opaque (a derived submesh) is saved, not 'Expected ... to be a tensor'",
        rebinds=("torch._functorch.aot_autograd", "torch._functorch.compilers"),
        # imports half of inductor (0.5 s); a later import while installed
        # copies the replacement, which uninstall() puts back
        rebinds_if_loaded=("torch._inductor.pattern_matcher",),
        default_args=(
            "torch._functorch.aot_autograd:aot_function",
            "torch._functorch.aot_autograd:aot_module_simplified",
            "torch._functorch.aot_autograd:aot_compile_joint_with_descriptors",
        ),
        series=(
            "0016 torch/_functorch/partitioners.py::default_partition",
            "0016 torch/_functorch/partitioners.py::is_opaque_node",
        ),
        guarded_by=(
            "test/distributed/test_device_mesh_derived_submesh.py::TestDerivedSubmesh::test_submesh_derived_in_dynamo_backward",
        ),
        v2_11=dict(build=_build_default_partition),
        v2_10=dict(build=_build_default_partition_2_10),
    ),
    PatchPoint(
        name="library.FakeScriptObject.__getitem__",
        target="torch._library.fake_class_registry:FakeScriptObject.__getitem__",
        build=lambda _original: fake_getitem,
        reason="mesh['tp'] on the fake mesh a __torch_dispatch__ sees while tracing (2.13 has it)",
        new_attribute=True,
        series=("0016 torch/_library/fake_class_registry.py::FakeScriptObject.__getitem__",),
        guarded_by=(
            "test/distributed/test_device_mesh_derived_submesh.py::TestDerivedSubmesh::test_submesh_derived_in_dispatch",
        ),
        **ONLY_BACKPORT,
    ),
    PatchPoint(
        name="fx.PythonKeyTracer.create_arg",
        target="torch.fx.experimental.proxy_tensor:PythonKeyTracer.create_arg",
        build=_build_create_arg,
        reason="a submesh derived in traced code is derived from the mesh input (2.13's reconstruct_fn)",
        series=(
            "0016 torch/fx/experimental/proxy_tensor.py::PythonKeyTracer.create_arg",
            "0016 torch/fx/experimental/proxy_tensor.py::PythonKeyTracer._try_reconstruct_opaque",
            "0016 torch/_library/opaque_object.py::get_reconstruct_fn",
            "0016 torch/_library/opaque_object.py::_OpaqueTypeInfo",
            "0016 torch/_library/opaque_object.py::_register_opaque_type_info",
            "0016 torch/distributed/device_mesh.py::_device_mesh_reconstruct_fn",
            "0016 torch/distributed/device_mesh.py::_register_distributed_opaque_types",
            "0016 torch/distributed/_ops/device_mesh.py::<module>",
            "0016 torch/distributed/_ops/device_mesh.py::_DEVICE_MESH_TYPE",
            "0016 torch/distributed/_ops/device_mesh.py::_get_submesh_impl",
        ),
        guarded_by=(
            "test/distributed/test_device_mesh_derived_submesh.py::TestDerivedSubmesh::test_submesh_derived_in_dynamo",
            "test/distributed/test_device_mesh_derived_submesh.py::TestDerivedSubmesh::test_submesh_derived_in_dispatch",
        ),
        **ONLY_BACKPORT,
    ),
    # torch 2.10's point of this name is torch_2_11_base's
    PatchPoint(
        name="aot_autograd._aot_stage2a_partition",
        target="torch._functorch._aot_autograd.graph_compile:_aot_stage2a_partition",
        build=_build_aot_stage2a_partition,
        reason="a real opaque saved for backward was not counted as a saved opaque (2.13: is_opaque_node)",
        series=("0023 torch/_functorch/_aot_autograd/graph_compile.py::_aot_stage2a_partition",),
        guarded_by=(
            "test/distributed/test_dtensor_opaque_mesh.py::TestDTensorOpaqueMeshCPU::test_aot_over_dynamo_mesh_output_backward_cpu",
        ),
        **ONLY_2_11,
    ),
]
