"""Helpers shared by the patch-series tools (git, versions, paths).

The tools operate on a *checkout*: a git repository laid out like PyTorch's
(``torch/...``, ``version.txt``), either a real PyTorch clone or one built by
``tools/make_checkout.py`` from an installed wheel.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PATCHES_ROOT = REPO_ROOT / "patches"

#: fixed identity and dates, so the base commit of a generated checkout (and
#: commits the tools make) are reproducible byte for byte.
BOT_NAME = "torch_subclass_rt tools"
BOT_EMAIL = "tools@torch-subclass-rt.invalid"
FIXED_DATE = "2000-01-01T00:00:00+0000"


class ToolError(Exception):
    """A failure to report to the user as one clear message (no traceback)."""


def git_env(deterministic: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    # never let the user's config or hooks change what the tools produce
    env.setdefault("GIT_CONFIG_NOSYSTEM", "1")
    env["GIT_TERMINAL_PROMPT"] = "0"
    for key in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(key, None)
    if deterministic:
        env.update(
            GIT_AUTHOR_NAME=BOT_NAME,
            GIT_AUTHOR_EMAIL=BOT_EMAIL,
            GIT_COMMITTER_NAME=BOT_NAME,
            GIT_COMMITTER_EMAIL=BOT_EMAIL,
            GIT_AUTHOR_DATE=FIXED_DATE,
            GIT_COMMITTER_DATE=FIXED_DATE,
        )
    else:
        # git am / commit need a committer identity even where none is configured
        env.setdefault("GIT_COMMITTER_NAME", BOT_NAME)
        env.setdefault("GIT_COMMITTER_EMAIL", BOT_EMAIL)
    return env


def git(repo: Path | str, *args: str, check: bool = True, deterministic: bool = False,
        input: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        env=git_env(deterministic),
        input=input,
    )
    if check and proc.returncode != 0:
        raise ToolError(
            f"git {' '.join(args)} failed in {repo} (exit {proc.returncode}):\n"
            f"{(proc.stderr or proc.stdout).strip()}"
        )
    return proc


_VERSION_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


def normalize_version(raw: str) -> str:
    """'2.11.0+cu130' / '2.11.0a0+git70d99e9' / '2.11.0\\n' -> '2.11.0'.

    For version *text* (a checkout's ``version.txt``, another interpreter's
    output, a ``--base`` tag), strictly: it raises ToolError unless the text
    starts with three numbers. The running torch's version is
    ``torch_subclass_rt._torch_compat.torch_version()`` / ``version_tuple()``;
    this one stays here so the git-only tools never import torch."""
    m = _VERSION_RE.match(raw.strip())
    if not m:
        raise ToolError(f"cannot read a torch version from {raw.strip()!r}")
    return ".".join(m.groups())


def detect_version(checkout: Path) -> str:
    """The torch version of a checkout: ``version.txt`` (PyTorch's source of
    truth), else ``torch/version.py`` (a build or wheel tree)."""
    vt = checkout / "version.txt"
    if vt.is_file():
        return normalize_version(vt.read_text())
    vp = checkout / "torch" / "version.py"
    if vp.is_file():
        m = re.search(r"""__version__\s*=\s*['"]([^'"]+)['"]""", vp.read_text())
        if m:
            return normalize_version(m.group(1))
    raise ToolError(
        f"{checkout} does not look like a PyTorch checkout: "
        "no version.txt and no readable torch/version.py"
    )


def series_dir(version: str, patches_dir: Path | None = None) -> Path:
    """Directory holding the series for ``version`` (patches/v<version>/)."""
    if patches_dir is not None:
        return Path(patches_dir)
    return PATCHES_ROOT / f"v{version}"


def series(directory: Path) -> list[Path]:
    patches = sorted(p for p in Path(directory).glob("*.patch") if p.is_file())
    return patches


def patched_files(patch: Path) -> list[str]:
    """Paths a format-patch file touches (b/ side), in order."""
    files: list[str] = []
    for line in patch.read_text().splitlines():
        m = re.match(r"^diff --git a/(\S+) b/(\S+)$", line)
        if m and m.group(2) not in files:
            files.append(m.group(2))
    return files


def is_dirty(checkout: Path) -> str:
    """Porcelain status of tracked changes (untracked files are ignored)."""
    return git(checkout, "status", "--porcelain", "--untracked-files=no").stdout.strip()


def main_wrapper(main) -> None:  # type: ignore[no-untyped-def]
    try:
        sys.exit(main())
    except ToolError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
