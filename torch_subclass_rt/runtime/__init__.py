"""Our AOTAutograd subclass runtime with opaque attrs: the code torch calls
into once ``install()`` ran. Nothing here patches torch or builds a
replacement; the points that put this code in torch's place are in
``points/`` (``points/subclass_runtime.py``).

``flatten`` builds subclass metadata and unwraps subclass arguments into the
flat list (inner tensors, opaques, symints); ``wrap`` rebuilds subclasses from
that list; ``tangents`` prepares runtime tangents for the backward; ``codegen``
and ``grad_codegen`` generate the per-call forward wrapper and the backward's
grad rebuild; ``errors`` holds the messages. Opaques take one slot in the flat
list, marked by :class:`~.meta.OpaqueMeta`. See Note [Opaque attrs in the flat
argument list] in ``flatten``.

Note [install() is transparent without opaques]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``install()`` is process-wide: every tensor subclass (DTensor, NestedTensor,
torchao's, the user's) then runs through this runtime and the patch points,
not only those with opaque attrs. The rule: on every path where no opaque
appears, the result is torch's own -- same outputs, graphs, recompiles and
errors, word for word. Every function that replaces a torch function (here
and in ``points/``) says, with a line referencing this Note, which of two
ways it keeps the rule:

* delegation: on a path without opaques it calls the torch object it
  replaced (or the wrapper torch itself built), with the arguments it got;
* identical: it reimplements torch's function, and without opaques it takes
  the same steps in the same order with the same results and errors (an
  edited copy of torch's own source whose inserted lines do nothing without
  opaques counts as this).

A replacement for which neither can be said must be changed to delegate.
One named exception, where install() deliberately differs from stock 2.11
without opaques (torch itself changed it later, so it is 2.13's
behaviour): an inner attr that is neither a tensor nor a registered opaque
gets, at trace time, an error naming the subclass and the attr (torch
2.12's check) where torch 2.11 fails later inside fakeification.

The other exception is a class of points, the fixes for torch 2.10/2.11
bugs outside the feature that block parity with native 2.13
(``points/lazy_log_and_donated_buffers.py``, Note [Scope of the fixes outside the feature]): they
apply to every graph, so a program that fails on stock 2.10/2.11 only
because of such a bug (a subclass without a ``__repr__`` of its own,
compiled) passes once ``install()`` ran. They never change a program that
stock torch runs; ``python -m torch_subclass_rt compare`` lists such a test
as fixed by ``install()``, apart from the tests it breaks.

Not an exception: torch 2.11 fills the dynamic *strides* of a rebuilt
subclass output from the slots of its sizes (a ``TwoTensor`` of shape
(4, 6) compiled with ``dynamic=True`` comes back with stride (4, 1)); 2.13
fixed it. Metadata without an opaque keeps 2.11's reading under install()
(``plans._torch_symbolic_slots`` asks torch's own
``compute_outer_size_and_stride``), metadata with one gets 2.13's, as the
series has it.

Checked by test/patching/test_transparency.py (stock and installed in one process)
and, on a user's own suite, by ``python -m torch_subclass_rt compare``.

Note [The runtime and the patch series are one change]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The functions here that replace torch's (``flatten.create_subclass_metadata``
and ``unwrap_tensor_subclasses``, ``wrap.creation_fn``, the errors in
``errors``) have an in-tree twin in the patch series
(``patches/v2.11.0/0001-*.patch``: ``subclass_utils.py``, ``schemas.py``,
``torch/_library/opaque_object.py``), as do the point modules' edits in
the later patches. Both must do the same thing, error messages included:
a change to one is ported to the other in the same change, and
``tools/verify_patches.py`` compares their graph dumps byte for byte
(CONTRIBUTING.md, "the parity check is the rule"). ``plans`` precomputes
what the series' ``creation_fn`` computes per call (with its fixed
``compute_outer_size_and_stride``): same results, so both sides change
together there too. The exceptions, which stay out of the series because
they change speed only, say so in their module docstrings:
``codegen`` and ``grad_codegen`` (the series keeps 2.11's
loop and walker, which reach the opaque slot through its ``creation_fn``).
"""

from .meta import OpaqueMeta

__all__ = ["OpaqueMeta"]
