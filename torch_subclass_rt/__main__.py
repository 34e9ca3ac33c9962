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
        for p in pts:
            mark = "*" if p.name in st.points else " "
            fix = f" [upstream {p.upstream_fix}]" if p.upstream_fix else ""
            if p.group:
                fix += f" [opt-in group {p.group!r}]"
            print(f"  {mark} {p.name:55s} {p.reason}{fix}")
            print(f"  {'':57s} {p.series_summary()}")
    else:
        print(f"torch {st.torch_version} ({mode}): nothing to patch")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_subclass_rt")
    sub = parser.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("status", help="torch version, mode and patch points")
    st.add_argument("--install", action="store_true", help="install() first")
    st.add_argument("--force", action="store_true", help="with --install: force=True")
    sub.add_parser("selftest", help="compile a subclass with an opaque attr and check it")
    from torch_subclass_rt import demo

    demo.add_arguments(sub.add_parser("demo", help="2-rank gloo training of a sharded MLP, compiled"))
    from torch_subclass_rt import compare

    compare.add_arguments(sub.add_parser(
        "compare", help="run a pytest suite stock and with install(); list the tests whose outcome differs",
        usage="python -m torch_subclass_rt compare [--force] [--dtensor] [--keep DIR] [--quiet] [--parallel] -- <pytest args>",
    ))
    args = parser.parse_args(argv)
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
