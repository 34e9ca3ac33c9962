"""Command line: ``python -m torch_subclass_rt {status,selftest,demo,compare}``."""

from __future__ import annotations

import argparse
import sys


def _status(args: argparse.Namespace) -> int:
    import torch_subclass_rt as tsrt

    if args.install:
        try:
            tsrt.install(force=args.force)
        except tsrt.UnsupportedTorchVersion as e:
            print(e)
            return 2
    st = tsrt.status()
    print(repr(st))
    from torch_subclass_rt.patching.registry import select
    from torch_subclass_rt.points import all_points

    try:  # the mode install() would pick here (with --force if given)
        mode = tsrt._choose_mode(st.torch_version, args.force)
    except tsrt.UnsupportedTorchVersion as e:
        print(e)
        return 2
    known = all_points()
    # opt-in groups too (marked), so every point's series map is listed
    pts = select(known, st.torch_version, mode, groups={p.group for p in known if p.group})
    if pts:
        print(f"patch points for torch {st.torch_version} ({mode}; * = applied):")
        if args.by_subsystem:
            # the points by the torch subsystem of their target (points/ has
            # one module per change; Note [One module per change])
            from torch_subclass_rt.points import by_subsystem, change_of

            for subsystem, in_subsystem in by_subsystem(pts).items():
                print(f"{subsystem}:")
                for p in in_subsystem:
                    mark = "*" if p.name in st.points else " "
                    print(f"  {mark} {p.name:55s} points/{change_of(p)}.py")
            return 0
        for p in pts:
            mark = "*" if p.name in st.points else " "
            fix = f" [upstream {p.upstream_fix}]" if p.upstream_fix else ""
            if p.group:
                fix += f" [opt-in group {p.group!r}]"
            print(f"  {mark} {p.name:55s} {p.reason}{fix}")
            print(f"  {'':57s} {p.series_summary()}")
            # the tests that fail without it (tools/ablate_points.py checks)
            for i, test in enumerate(p.guarded_by or ("no test names it",)):
                print(f"  {'':57s} {'guarded by' if i == 0 else '':10s} {test}")
    else:
        print(f"torch {st.torch_version} ({mode}): nothing to patch")
    return 0


_DESCRIPTION = """\
Opaque (non-tensor) attributes in a tensor subclass's __tensor_flatten__
under torch.compile, on the torch you run. install() picks a mode from the
torch version (backport on 2.10/2.11, native+fixes on releases with known
upstream bugs, native otherwise); these commands show, check and compare it.
"""

_EPILOG = """\
examples:
  python -m torch_subclass_rt status --install     what install() does on this torch
  python -m torch_subclass_rt selftest             compile a subclass with an opaque attr
  python -m torch_subclass_rt demo                 2-rank gloo training, compiled
  python -m torch_subclass_rt compare -- tests/    your suite, stock vs install()

docs: README.md and docs/ in the source tree.
"""


def _sub(sub, name: str, help: str, description: str, examples: list[tuple[str, str]], **kw):
    epilog = "examples:\n" + "\n".join(
        f"  python -m torch_subclass_rt {name}{(' ' + args) if args else ''}\n      {what}"
        for args, what in examples
    )
    import textwrap

    return sub.add_parser(name, help=help, description=textwrap.fill(description, 78), epilog=epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter, **kw)


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (test/tools/test_docs.py checks every command the
    docs show against it)."""
    parser = argparse.ArgumentParser(
        prog="python -m torch_subclass_rt", description=_DESCRIPTION, epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="{status,selftest,demo,compare}")
    st = _sub(
        sub, "status", "torch version, mode and patch points",
        "Print the torch version, the install mode and, for this torch, every patch point "
        "install() selects: why it exists, the upstream fix it carries and its counterpart "
        "in the patch series (* marks the applied ones).",
        [("", "what would be applied (nothing is installed)"),
         ("--install", "install() first, then list what was applied"),
         ("--install --force", "torch 2.13: our runtime in place of torch's"),
         ("--by-subsystem", "the points grouped by the torch subsystem of their target")],
    )
    st.add_argument("--install", action="store_true", help="install() first")
    st.add_argument("--force", action="store_true", help="with --install: force=True")
    st.add_argument("--by-subsystem", action="store_true",
                    help="group the points by torch subsystem, each with the change module declaring it")
    _sub(
        sub, "selftest", "compile a subclass with an opaque attr and check it",
        "install(), then compile a function of a subclass holding an opaque mesh handle with "
        "eager, aot_eager and inductor, forward and backward, for two meshes: one compile, and "
        "outputs and grads carry each caller's mesh. Exit status 1 on any mismatch.",
        [("", "run it")],
    )
    from torch_subclass_rt import demo

    demo.add_arguments(_sub(
        sub, "demo", "2-rank gloo training of a sharded MLP, compiled",
        "Train a small MLP on a ShardTensor over 2 real gloo ranks, compiled, checked against "
        "eager and a single-process reference, then switch to a fresh process group with no "
        "recompile. Exit status 1 on any mismatch; a failing rank fails it promptly.",
        [("", "inductor, our MeshHandle as the mesh"),
         ("--mesh device_mesh --backend aot_eager", "a DeviceMesh as the inner attr")],
    ))
    from torch_subclass_rt import compare

    compare.add_arguments(_sub(
        sub, "compare", "run a pytest suite stock and with install(); list the tests whose outcome differs",
        "Run your pytest suite twice, stock and with install() in every process it starts, each "
        "with a fresh inductor cache, and list the tests whose outcome differs with their first "
        "error line. Exit status 0: no difference; 1: some differ; 2: a run left no outcomes.",
        [("-- tests/ -k subclass -x", "your subclass tests"),
         ("--parallel -- tests/", "both runs at once (two free cores)"),
         ("--dtensor -- test_dtensor_compile.py", "installed run: install(dtensor=True)")],
        usage="python -m torch_subclass_rt compare [--force] [--dtensor] [--keep DIR] [--quiet] [--parallel] -- <pytest args>",
    ))
    return parser


def main(argv: list[str] | None = None) -> int:
    from torch_subclass_rt import compare, demo

    args = build_parser().parse_args(argv)
    if args.cmd == "compare":
        return compare.compare(args.pytest_args, force=args.force, keep=args.keep,
                               quiet=args.quiet, parallel=args.parallel, dtensor=args.dtensor)
    if args.cmd == "status":
        return _status(args)
    if args.cmd == "demo":
        return demo.run_cli(args)
    from torch_subclass_rt.selftest import main as selftest

    return selftest()


if __name__ == "__main__":
    sys.exit(main())
