"""Run one differential case: eager vs compiled, and stock vs install().

:func:`check_case` (opaque arm, every mode): eager and compiled agree on
values, output types, which opaque object each output and grad carries (by
identity), a second call with fresh opaques of the same sharing neither
recompiles nor loses identities, and breaking the sharing recompiles and
still agrees.

:func:`observe` (transparency arm, torch 2.11): everything observable about
compiling a case once - outputs, grads, Dynamo/AOT graph dumps, compile
count, or the error's type and first line - for comparing stock torch with
install().
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch._dynamo.testing import CompileCounterWithBackend, normalize_gm

import fixtures
import gen
from gen import FuzzTensor


def _structure(x, labels):
    """Comparable description of a value: type, opaque identities (as the
    label of the object in ``labels``), inner structure."""
    if isinstance(x, FuzzTensor):
        return (
            "FuzzTensor",
            tuple(labels.get(id(o), ("foreign", repr(o))) for o in x.opaques()),
            x.ctx if not isinstance(x.ctx, gen.Scale) else ("Scale", x.ctx.factor),
            tuple(_structure(t, labels) for t in x.tensors()),
        )
    if isinstance(x, torch.Tensor):
        return ("Tensor", tuple(x.shape), x.dtype)
    if isinstance(x, gen.Handle):
        return ("Handle", labels.get(id(x), ("foreign", repr(x))))
    return (type(x).__name__,)


def _leaves(x):
    """The plain tensors inside ``x``: a wrapper subclass's own storage is
    not a real one (its data pointer cannot be read), so any subclass,
    FuzzTensor or a generated definition, is walked through its inner
    tensors."""
    if isinstance(x, FuzzTensor):
        return [leaf for t in x.tensors() for leaf in _leaves(t)]
    if is_traceable_wrapper_subclass(x):
        attrs, _ = x.__tensor_flatten__()
        inner = (getattr(x, a) for a in attrs)
        return [leaf for t in inner if isinstance(t, torch.Tensor) for leaf in _leaves(t)]
    if isinstance(x, torch.Tensor):
        return [x.detach()]
    return []


def _labels_of(objs):
    return {id(o): key for key, o in objs.items()}


def _grads(case, inputs, outs):
    """Grads of every requires-grad input for the sum of all float outputs,
    with tangents like the outputs (ones, same subclass and opaques)."""
    want = [x for x, s in zip(inputs, case.inputs) if s.requires_grad]
    diff = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    if not want or not diff:
        return None
    grads = torch.autograd.grad(
        diff, want, [torch.ones_like(o) for o in diff], allow_unused=True
    )
    return list(grads)


def _run(fn, case, data, objs, split, backward, factor=2.0):
    inputs = gen.make_inputs(case, data, objs, split, factor)
    outs = fn(*inputs)
    result = {"outs": outs, "inputs": inputs}
    # an output that *is* an input: remember which
    result["aliases"] = [
        next((i for i, x in enumerate(inputs) if o is x), None) for o in outs
    ]
    if backward:
        result["grads"] = _grads(case, inputs, outs)
    # in-place ops on inputs: their data after the call
    result["inputs_after"] = [_leaves(x) for x in inputs]
    return result


def _compare(case, eager, comp, labels, what):
    def fail(msg):
        raise AssertionError(f"{what}: {msg}")

    if len(eager["outs"]) != len(comp["outs"]):
        fail(f"{len(eager['outs'])} outputs eager, {len(comp['outs'])} compiled")
    for k, (e, c) in enumerate(zip(eager["outs"], comp["outs"])):
        se, sc = _structure(e, labels), _structure(c, labels)
        if se != sc:
            fail(f"output {k}: eager {se} != compiled {sc}")
        for le, lc in zip(_leaves(e), _leaves(c)):
            torch.testing.assert_close(lc, le, rtol=1e-4, atol=1e-4, msg=lambda m: f"{what}: output {k}: {m}")
    if eager["aliases"] != comp["aliases"]:
        fail(f"outputs aliasing inputs: eager {eager['aliases']} compiled {comp['aliases']}")
    for k, (e, c) in enumerate(zip(eager["inputs_after"], comp["inputs_after"])):
        for le, lc in zip(e, c):
            torch.testing.assert_close(lc, le, rtol=1e-4, atol=1e-4, msg=lambda m: f"{what}: input {k} after the call: {m}")
    ge, gc = eager.get("grads"), comp.get("grads")
    if (ge is None) != (gc is None):
        fail(f"grads: eager {ge is not None} compiled {gc is not None}")
    if ge is not None:
        for k, (e, c) in enumerate(zip(ge, gc)):
            se, sc = _structure(e, labels), _structure(c, labels)
            if se != sc:
                fail(f"grad {k}: eager {se} != compiled {sc}")
            for le, lc in zip(_leaves(e), _leaves(c)):
                torch.testing.assert_close(lc, le, rtol=1e-4, atol=1e-4, msg=lambda m: f"{what}: grad {k}: {m}")


def _shares_between_used_inputs(case):
    """An opaque shared by two inputs the function reads: breaking that
    sharing must recompile (Dynamo guards only what the function uses)."""
    import re

    body = case.source.split("\n", 1)[1]
    owners: dict = {}
    for i, s in enumerate(case.inputs):
        if re.search(rf"\bx{i}\b", body):
            for lab in (*s.opaque_labels, *s.outer_labels):
                owners.setdefault(lab, set()).add(i)
    return any(len(v) > 1 for v in owners.values())


def _has_sharing(case):
    seen = set()
    for s in case.inputs:
        for lab in (*s.opaque_labels, *s.outer_labels):
            if lab in seen:
                return True
            seen.add(lab)
    return False


def _mark_dynamic(case, inputs):
    for x, s in zip(inputs, case.inputs):
        if s.dynamic:
            torch._dynamo.mark_dynamic(x, 0)


class TorchLimitation(Exception):
    """The case hits a limitation torch documents (and native 2.13 has too):
    not a difference to report, not a valid example."""


#: torch 2.11-2.14, AOTAutograd (aot_autograd.py): outputs aliasing one
#: intermediate while any input or output is a subclass
_ALIASED_OUTPUTS = "ANY output aliasing (even for regular tensors) is currently unsupported"


def _outputs_alias_each_other(outs) -> bool:
    storages = [
        leaf.untyped_storage().data_ptr()
        for o in outs
        for leaf in _leaves(o)
        if leaf.numel()
    ]
    return len(storages) != len(set(storages))


def _first_compiled_call(run, eager):
    try:
        return run()
    except Exception as e:
        # only where the eager outputs do alias each other: then torch
        # itself refuses the graph, with or without install()
        if _ALIASED_OUTPUTS in str(e) and _outputs_alias_each_other(eager["outs"]):
            raise TorchLimitation(_ALIASED_OUTPUTS) from e
        raise


def check_case(case: gen.Case, seed: int = 0) -> None:
    torch._dynamo.reset()
    fn = gen.compile_fn(case)
    g = torch.Generator().manual_seed(seed)
    data = gen.make_data(case, g)
    cnt = CompileCounterWithBackend(case.backend)
    compiled = torch.compile(fn, backend=cnt, fullgraph=True)

    def compiled_call(*inputs):
        _mark_dynamic(case, inputs)
        return compiled(*inputs)

    # 1. first call
    objs = gen.make_opaques(case, "1")
    labels = _labels_of(objs)
    eager = _run(fn, case, data, objs, False, case.backward)
    comp = _first_compiled_call(
        lambda: _run(compiled_call, case, data, objs, False, case.backward), eager
    )
    _compare(case, eager, comp, labels, "first call")
    frames = cnt.frame_count

    # 2. fresh opaques, same sharing: no recompile, identities follow
    objs2 = gen.make_opaques(case, "2")
    labels2 = _labels_of(objs2)
    eager = _run(fn, case, data, objs2, False, case.backward)
    comp = _run(compiled_call, case, data, objs2, False, case.backward)
    _compare(case, eager, comp, labels2, "second call (fresh opaques, same sharing)")
    if cnt.frame_count != frames:
        raise AssertionError(
            f"second call (fresh opaques, same sharing) recompiled: {frames} -> {cnt.frame_count}"
        )

    # 3. broken sharing: recompiles (identity guards), still equal
    if _has_sharing(case):
        objs3 = gen.make_opaques(case, "3", split=True)
        labels3 = _labels_of(objs3)
        eager = _run(fn, case, data, objs3, True, case.backward)
        comp = _run(compiled_call, case, data, objs3, True, case.backward)
        _compare(case, eager, comp, labels3, "third call (sharing broken)")
        if cnt.frame_count == frames and _shares_between_used_inputs(case):
            raise AssertionError("third call (sharing broken) did not recompile")

    # 4. a value-type opaque the function reads, another value: eager's
    # values (a graph that baked the old value must not run, from Dynamo's
    # cache or AOTAutograd's)
    if gen.VALUE_READ in case.source:
        eager = _run(fn, case, data, objs2, False, case.backward, factor=0.5)
        comp = _run(compiled_call, case, data, objs2, False, case.backward, factor=0.5)
        _compare(case, eager, comp, labels2, "fourth call (another value of the Scale read)")


def check_refusal(case: gen.Case, seed: int = 0, refusal=None) -> None:
    """A case native torch 2.13 refuses (``gen.REFUSALS``): eager runs, the
    compiled call raises the same error class with the same message."""
    import re

    refusal = refusal or gen.expected_refusal(case)

    torch._dynamo.reset()
    fn = gen.compile_fn(case)
    data = gen.make_data(case, torch.Generator().manual_seed(seed))
    objs = gen.make_opaques(case, "1")
    _run(fn, case, data, objs, False, case.backward)
    compiled = torch.compile(fn, backend=case.backend, fullgraph=True)
    cls_name, pattern = refusal
    try:
        inputs = gen.make_inputs(case, data, objs)
        _mark_dynamic(case, inputs)
        compiled(*inputs)
    except Exception as e:
        if type(e).__name__ != cls_name or not re.search(pattern, str(e)):
            raise AssertionError(
                f"expected the refusal native 2.13 gives ({cls_name}: /{pattern}/), got "
                f"{type(e).__name__}: {str(e)[:1000]}"
            ) from e
        return
    raise AssertionError(f"compiled where native 2.13 refuses ({cls_name}: /{pattern}/)")


# --------------------------------------------------------------------------
# collectives arm


def _collective_inputs(case, data, groups):
    subs = [gen.PGTensor(d.clone(), groups[lab]) for d, lab in zip(data, case.groups)]
    return subs + [d.clone() for d in data[len(case.groups):]]


def _compare_collective(eager, comp, what):
    if len(eager) != len(comp):
        raise AssertionError(f"{what}: {len(eager)} outputs eager, {len(comp)} compiled")
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    for k, (e, c) in enumerate(zip(eager, comp)):
        if isinstance(e, AsyncCollectiveTensor):
            # eager's lazy-wait wrapper of a collective's result; compiled
            # code waits in the graph and returns the plain tensor
            e = e.wait()
        if isinstance(e, torch.Tensor):
            if type(c) is not type(e):
                raise AssertionError(f"{what}: output {k}: eager {type(e)} compiled {type(c)}")
            torch.testing.assert_close(c, e, msg=lambda m: f"{what}: output {k}: {m}")
        elif c is not e:  # a group: the caller's object, not the traced one
            raise AssertionError(f"{what}: output {k}: eager {e!r}, compiled {c!r}")


def check_collective(case: gen.CollectiveCase, seed: int = 0) -> None:
    """Eager vs compiled (aot_eager, fullgraph) over one-rank gloo groups:
    values and the groups returned; the same groups again reuse the graph;
    fresh groups recompile where a collective runs over one (its name is a
    constant of the graph) and still agree."""
    torch._dynamo.reset()
    fn = gen.compile_fn(case)
    g = torch.Generator().manual_seed(seed)
    data = [torch.randn(case.shape, generator=g) for _ in range(len(case.groups) + case.n_plain)]
    cnt = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=cnt, fullgraph=True)

    groups = {lab: fixtures.new_group() for lab in sorted(set(case.groups))}
    _compare_collective(fn(*_collective_inputs(case, data, groups)),
                        compiled(*_collective_inputs(case, data, groups)), "first call")
    frames = cnt.frame_count
    _compare_collective(fn(*_collective_inputs(case, data, groups)),
                        compiled(*_collective_inputs(case, data, groups)), "second call (same groups)")
    if cnt.frame_count != frames:
        raise AssertionError(f"the same groups recompiled: {frames} -> {cnt.frame_count}")

    fresh = {lab: fixtures.new_group() for lab in groups}
    _compare_collective(fn(*_collective_inputs(case, data, fresh)),
                        compiled(*_collective_inputs(case, data, fresh)), "third call (fresh groups)")
    if case.collectives and cnt.frame_count == frames:
        raise AssertionError("fresh groups ran the graph traced for the first ones (no recompile)")


# --------------------------------------------------------------------------
# transparency arm


def observe(case: gen.Case, seed: int, backend_factory) -> dict:
    """Compile ``case`` once with the backend ``backend_factory()`` returns (a
    recorder with ``graphs`` / ``fw_graphs`` / ``bw_graphs``) and describe
    everything observable. Never raises for the case's own errors."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    fn = gen.compile_fn(case)
    data = gen.make_data(case, torch.Generator().manual_seed(seed))
    objs = gen.make_opaques(case)
    recorder = backend_factory()
    cnt = CompileCounterWithBackend(recorder)
    compiled = torch.compile(fn, backend=cnt, fullgraph=True)
    seen: dict = {}
    try:
        for _ in range(2):
            inputs = gen.make_inputs(case, data, objs)
            _mark_dynamic(case, inputs)
            outs = compiled(*inputs)
            seen.setdefault("outs", [])
            seen["outs"].append(
                [(_structure(o, {}), [leaf.tolist() for leaf in _leaves(o)]) for o in outs]
            )
            if case.backward:
                grads = _grads(case, inputs, outs)
                seen.setdefault("grads", []).append(
                    None if grads is None else
                    [(_structure(gr, {}), [leaf.tolist() for leaf in _leaves(gr)]) for gr in grads]
                )
    except Exception as e:  # noqa: BLE001 - compared, not swallowed
        import re

        # the whole message, object addresses masked
        seen["error"] = (type(e).__name__, re.sub(r"0x[0-9a-f]+", "0x?", str(e)))
    seen["frames"] = cnt.frame_count
    seen["graphs"] = [
        normalize_gm(gm.print_readable(print_output=False))
        for gm in (*getattr(recorder, "graphs", []), *getattr(recorder, "fw_graphs", []),
                   *getattr(recorder, "bw_graphs", []))
    ]
    return seen


def check_transparency(case: gen.Case, seed: int = 0) -> None:
    """Stock torch 2.11 vs install(), one process: ``observe`` must agree
    on everything. Leaves torch installed (the mode under test)."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    stock, ours = fixtures.stock_and_installed(lambda: observe(case, seed, AotEagerAndRecordGraphs))
    for key in sorted(set(stock) | set(ours)):
        if stock.get(key) != ours.get(key):
            raise AssertionError(
                f"install() changed {key!r}:\n--- stock ---\n{stock.get(key)}\n"
                f"--- install() ---\n{ours.get(key)}"
            )
