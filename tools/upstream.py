#!/usr/bin/env python3
"""Send the patch series upstream as a ghstack stack of pull requests.

    python tools/upstream.py CHECKOUT [--branch NAME] [--base-branch BRANCH]
                             [--patches-dir DIR] [--dry-run] [-- GHSTACK_ARGS...]

In a real PyTorch clone (CHECKOUT): create the branch ``NAME`` (default
``opaque-subclass-attrs-v<version>``) at the base tag ``v<version>``, apply
the series as commits with ``git am -3`` (tools/apply_patches.py), then run

    ghstack submit [--base BRANCH] v<version>..HEAD [GHSTACK_ARGS...]

so that exactly the series' commits become the stack (one PR per commit).
``--base-branch`` is ghstack's ``--base/-B``: the branch the PRs target
(e.g. ``release/2.11``; ghstack's default is the repository's default branch).

``--dry-run``: everything local (branch, commits) is done and the ghstack
command is printed, but ghstack is not run. ghstack itself has no dry-run
flag (0.18: submit takes --message, --update-fields, --short, --force,
--no-skip, --draft, --base, --stack/--no-stack, --reviewer, --label,
--direct/--no-direct, --no-fetch), so nothing is passed to it for this.

Refuses (nothing changed) on a dirty tree, a missing tag, an existing branch
of that name, or a series that does not apply; on a conflict the previous
branch is checked out again and the new branch deleted.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools._common import ToolError, git, git_env, main_wrapper  # noqa: E402
from tools import apply_patches  # noqa: E402


def current_ref(checkout: Path) -> str:
    proc = git(checkout, "symbolic-ref", "-q", "--short", "HEAD", check=False)
    if proc.returncode == 0:
        return proc.stdout.strip()
    return git(checkout, "rev-parse", "HEAD").stdout.strip()


def prepare_branch(checkout: Path, branch: str | None, patches_dir: Path | None) -> tuple[str, str, list[str]]:
    """Branch at v<version> with the series applied; returns (branch, tag, patches)."""
    version, _ = apply_patches.preflight(checkout, patches_dir)
    tag = f"v{version}"
    branch = branch or f"opaque-subclass-attrs-v{version}"
    if git(checkout, "rev-parse", "-q", "--verify", f"refs/heads/{branch}", check=False).returncode == 0:
        raise ToolError(f"branch {branch} already exists in {checkout}; pass --branch or delete it")
    previous = current_ref(checkout)
    git(checkout, "checkout", "-q", "-b", branch, tag)
    try:
        applied = apply_patches.apply(checkout, patches_dir=patches_dir)
    except ToolError:
        git(checkout, "checkout", "-q", previous, check=False)
        git(checkout, "branch", "-D", branch, check=False)
        raise
    return branch, tag, applied


def ghstack_command(tag: str, base_branch: str | None, extra: list[str]) -> list[str]:
    cmd = ["ghstack", "submit"]
    if base_branch:
        cmd += ["--base", base_branch]
    cmd.append(f"{tag}..HEAD")
    return cmd + extra


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", type=Path, help="a PyTorch clone with the v<version> tag")
    ap.add_argument("--branch", help="branch to create (default opaque-subclass-attrs-v<version>)")
    ap.add_argument("--base-branch", help="ghstack --base: the branch the PRs target")
    ap.add_argument("--patches-dir", type=Path, help="series to send (default patches/v<version>/)")
    ap.add_argument("--dry-run", action="store_true",
                    help="make the branch and commits, print the ghstack command, do not run it")
    args = ap.parse_args(argv)
    checkout = args.checkout.resolve()

    if not args.dry_run and shutil.which("ghstack") is None:
        raise ToolError("ghstack is not on PATH (python -m pip install ghstack), or use --dry-run")
    branch, tag, applied = prepare_branch(checkout, args.branch, args.patches_dir)
    print(f"{checkout}: branch {branch} at {tag} with {len(applied)} commits:")
    print(git(checkout, "log", "--oneline", f"{tag}..HEAD").stdout.rstrip())
    cmd = ghstack_command(tag, args.base_branch, extra)
    if args.dry_run:
        print(f"dry run: would run in {checkout}: {' '.join(cmd)}")
        return 0
    print(f"running: {' '.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, cwd=checkout, env=git_env())
    if proc.returncode != 0:
        raise ToolError(f"ghstack failed (exit {proc.returncode}); branch {branch} is kept")
    return 0


if __name__ == "__main__":
    main_wrapper(main)
