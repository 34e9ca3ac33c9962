#!/usr/bin/env python3
"""Apply the patch series for a checkout's torch version.

    python tools/apply_patches.py CHECKOUT [--check] [--patches-dir DIR]

CHECKOUT is a git repository laid out like PyTorch's (a real clone, or one
made by tools/make_checkout.py). Its version is read from ``version.txt``
(else ``torch/version.py``) and ``patches/v<version>/*.patch`` is applied in
order with ``git am -3``, one commit per patch.

Refuses, leaving the checkout exactly as it was:
  * no series for that version, or the base tag ``v<version>`` is missing;
  * a dirty tree (tracked changes) or a ``git am``/rebase already in progress;
  * a patch that does not apply: the message names the patch and the files
    that conflict, and ``git am --abort`` puts HEAD, index and tree back.

``--check`` is a dry run: the series is applied in a temporary worktree
(detached at HEAD) that is removed afterwards; the checkout is not touched.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools._common import (  # noqa: E402
    ToolError,
    detect_version,
    git,
    is_dirty,
    main_wrapper,
    series,
    series_dir,
)


def _am_in_progress(checkout: Path) -> bool:
    gitdir = Path(git(checkout, "rev-parse", "--absolute-git-dir").stdout.strip())
    return any((gitdir / d).exists() for d in ("rebase-apply", "rebase-merge"))


def preflight(checkout: Path, patches_dir: Path | None) -> tuple[str, list[Path]]:
    """Checks that leave nothing behind; returns (version, patches)."""
    checkout = Path(checkout)
    if not (checkout / ".git").exists():
        raise ToolError(f"{checkout} is not a git checkout")
    version = detect_version(checkout)
    directory = series_dir(version, patches_dir)
    patches = series(directory) if directory.is_dir() else []
    if not patches:
        raise ToolError(
            f"no patch series for torch {version}: {directory} has no *.patch "
            f"(wrong base? series exist for: {', '.join(available_versions()) or 'none'})"
        )
    tag = f"v{version}"
    if git(checkout, "rev-parse", "-q", "--verify", f"refs/tags/{tag}", check=False).returncode:
        raise ToolError(
            f"{checkout} has no tag {tag}: the series applies to the {tag} base "
            "(fetch the tag, or make the checkout with tools/make_checkout.py)"
        )
    if _am_in_progress(checkout):
        raise ToolError(f"{checkout}: a git am/rebase is in progress; finish or abort it first")
    dirty = is_dirty(checkout)
    if dirty:
        raise ToolError(
            f"{checkout} has uncommitted changes; commit or stash them first:\n{dirty}"
        )
    return version, patches


def available_versions() -> list[str]:
    from tools._common import PATCHES_ROOT

    if not PATCHES_ROOT.is_dir():
        return []
    return sorted(p.name[1:] for p in PATCHES_ROOT.iterdir() if p.is_dir() and p.name.startswith("v"))


def _conflict_report(worktree: Path, patch: Path, output: str) -> str:
    files = set()
    for line in output.splitlines():
        for pat in (r"error: patch failed: (\S+?):\d+", r"CONFLICT \([^)]*\): .* in (\S+)",
                    r"error: (\S+): does not exist in index", r"error: (\S+): patch does not apply"):
            m = re.search(pat, line)
            if m:
                files.add(m.group(1))
    unmerged = git(worktree, "diff", "--name-only", "--diff-filter=U", check=False).stdout.split()
    files.update(unmerged)
    where = ", ".join(sorted(files)) or "(see git output below)"
    return (
        f"patch {patch.name} does not apply: conflict in {where}\n"
        f"--- git am output ---\n{output.strip()}"
    )


def am_series(repo: Path, patches: list[Path]) -> list[str]:
    """git am -3 each patch; on failure abort (restoring repo) and raise."""
    before = git(repo, "rev-parse", "HEAD").stdout.strip()
    applied = []
    for patch in patches:
        proc = git(repo, "am", "-3", "--keep-non-patch", "--keep-cr", "--no-gpg-sign", str(patch.resolve()), check=False)
        if proc.returncode != 0:
            report = _conflict_report(repo, patch, proc.stdout + proc.stderr)
            git(repo, "am", "--abort", check=False)
            # am --abort returns to where *this* am started; earlier patches
            # of the series were committed: go back to the base as well.
            git(repo, "reset", "-q", "--hard", before)
            raise ToolError(report + f"\n(checkout left at {before[:12]}, as it was)")
        applied.append(patch.name)
    return applied


def apply(checkout: Path, *, check: bool = False, patches_dir: Path | None = None) -> list[str]:
    checkout = Path(checkout).resolve()
    version, patches = preflight(checkout, patches_dir)
    if not check:
        return am_series(checkout, patches)
    tmp = Path(tempfile.mkdtemp(prefix="tsrt-apply-check-"))
    wt = tmp / "wt"
    try:
        git(checkout, "worktree", "add", "-q", "--detach", str(wt), "HEAD")
        return am_series(wt, patches)
    finally:
        git(checkout, "worktree", "remove", "--force", str(wt), check=False)
        git(checkout, "worktree", "prune", check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", type=Path)
    ap.add_argument("--check", action="store_true", help="dry run in a temporary worktree")
    ap.add_argument("--patches-dir", type=Path, help="use this series instead of patches/v<version>/")
    args = ap.parse_args(argv)
    applied = apply(args.checkout, check=args.check, patches_dir=args.patches_dir)
    verb = "would apply" if args.check else "applied"
    print(f"{verb} {len(applied)} patches to {args.checkout}:")
    for name in applied:
        print(f"  {name}")
    return 0


if __name__ == "__main__":
    main_wrapper(main)
