"""The user docs cannot drift from the code.

* every relative link and anchor in README.md, CONTRIBUTING.md and docs/
  resolves (GitHub's heading slugs, or an explicit ``<a id=...>``);
* every ``python -m torch_subclass_rt ...`` command shown names a
  subcommand and options the CLI's parser has;
* README's supported-releases table lists exactly the releases
  ``_torch_compat`` supports, each with the mode ``install()`` picks and the
  upstream fixes the registry carries there;
* docs/errors.md shows each error with the very message the package builds
  (``EXPECTTEST_ACCEPT=1`` rewrites the message blocks, nothing else).

Runs on any torch (it builds messages and selects points as data; nothing
is installed or compiled).
"""

from __future__ import annotations

import os
import re
import unittest
from pathlib import Path

import torch_subclass_rt as tsrt
from torch_subclass_rt import _torch_compat
from torch_subclass_rt.__main__ import build_parser
from torch_subclass_rt.runtime import errors

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")])
ACCEPT = os.environ.get("EXPECTTEST_ACCEPT") == "1"

_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for i, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            yield i, line


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: markup and punctuation dropped,
    lower case, spaces to hyphens (duplicates get -1, -2, ... below)."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text()
    found: set[str] = set(_EXPLICIT_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for _, line in _prose_lines(text):
        m = _HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def links(path: Path):
    """(line number, target) of each Markdown link outside code blocks."""
    for i, line in _prose_lines(path.read_text()):
        line = re.sub(r"`[^`]*`", "", line)  # code spans hold no links
        for m in _LINK.finditer(line):
            yield i, m.group(1)


class TestDocLinks(unittest.TestCase):
    def test_doc_files_exist(self):
        names = {p.relative_to(ROOT).as_posix() for p in DOC_FILES}
        for required in ("README.md", "CONTRIBUTING.md", "docs/adopting.md", "docs/errors.md",
                         "docs/fixes.md", "docs/design.md", "docs/performance.md"):
            self.assertIn(required, names)

    def test_relative_links_and_anchors_resolve(self):
        broken = []
        for doc in DOC_FILES:
            for line, target in links(doc):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, ...
                    continue
                path_part, _, anchor = target.partition("#")
                dest = (doc.parent / path_part).resolve() if path_part else doc
                where = f"{doc.relative_to(ROOT)}:{line}: {target}"
                if not dest.exists():
                    broken.append(f"{where} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    broken.append(f"{where} (no heading or <a id> {anchor!r} in {dest.name})")
        self.assertEqual(broken, [], "broken links:\n" + "\n".join(broken))

    def test_readme_links_every_doc(self):
        targets = {t.partition("#")[0] for _, t in links(ROOT / "README.md")}
        for doc in (ROOT / "docs").glob("*.md"):
            self.assertIn(f"docs/{doc.name}", targets, f"README does not link docs/{doc.name}")

    def test_readme_is_short(self):
        self.assertLessEqual(len((ROOT / "README.md").read_text().splitlines()), 150)

    def test_slug(self):
        self.assertEqual(github_slug("Two `install()` modes, and why!"), "two-install-modes-and-why")
        self.assertEqual(github_slug("torch 2.12.1 / 2.13.0"), "torch-2121--2130")


_COMMAND = re.compile(r"python3? -m torch_subclass_rt((?:[ \t]+[^\s`|;&]+)*)")


def shown_commands():
    """(file, line, argv) of each ``python -m torch_subclass_rt ...`` shown."""
    for doc in DOC_FILES:
        for i, line in enumerate(doc.read_text().splitlines(), 1):
            for m in _COMMAND.finditer(line):
                argv = m.group(1).replace("\\|", "|").split()
                if "--" in argv:  # what follows goes to pytest
                    argv = argv[: argv.index("--")]
                yield doc.relative_to(ROOT).as_posix(), i, argv


def _subparsers(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def _options(parser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


class TestDocCommands(unittest.TestCase):
    def test_shown_commands_exist(self):
        parser = build_parser()
        subs = _subparsers(parser)
        problems, seen = [], 0
        for doc, line, argv in shown_commands():
            seen += 1
            words = [a for a in argv if not a.startswith("[") and a not in ("...",)]
            if not words:
                continue
            cmd = words[0]
            if cmd.startswith("-"):
                if cmd not in _options(parser):
                    problems.append(f"{doc}:{line}: no option {cmd}")
                continue
            if cmd not in subs:
                problems.append(f"{doc}:{line}: no subcommand {cmd!r} (have {sorted(subs)})")
                continue
            opts = _options(subs[cmd])
            for word in words[1:]:
                flag = word.strip("[]").split("=", 1)[0]
                if flag.startswith("--") and flag not in opts:
                    problems.append(f"{doc}:{line}: {cmd} has no option {flag}")
        self.assertGreater(seen, 3, "no commands found: the pattern is broken")
        self.assertEqual(problems, [], "\n".join(problems))

    def test_every_subcommand_has_a_description_and_example(self):
        for name, sub in _subparsers(build_parser()).items():
            self.assertTrue(sub.description, f"{name}: no description")
            self.assertIn("python -m torch_subclass_rt " + name, sub.epilog or "",
                          f"{name}: --help shows no example")


def _table_after(text: str, heading: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("#") and heading in l)
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|") and not re.match(r"^\|[-| :]+\|$", line):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows[1:]  # without the header


#: the upstream PR of the feature itself, which the backport carries whole
FEATURE = "PR 176457"


def _fix_key(upstream_fix: str) -> str:
    """'PR 188799 (issue 188796)' -> 'PR 188799': the reference a reader
    follows, without the note in parentheses."""
    return upstream_fix.split(" (", 1)[0]


class TestSupportedReleases(unittest.TestCase):
    def setUp(self):
        self.rows = _table_after((ROOT / "README.md").read_text(), "Supported releases")

    def test_releases_and_modes(self):
        from torch_subclass_rt._modes import Mode

        listed = {}
        for row in self.rows:
            version = row[0].strip("`")
            listed[version] = row[1]
        releases = [*_torch_compat.BACKPORT_VERSIONS, *_torch_compat.FIXES_VERSIONS]
        self.assertEqual(sorted(v for v in listed if re.fullmatch(r"\d+\.\d+\.\d+", v)),
                         sorted(releases))
        for version in releases:
            mode = tsrt._choose_mode(version, False)
            self.assertIn(f"`{mode.value}`", listed[version], version)
            if version in _torch_compat.FORCED_VERSIONS:
                self.assertIn(f"`{Mode.FORCED.value}`", listed[version], version)
        others = [v for v in listed if not re.fullmatch(r"\d+\.\d+\.\d+", v)]
        self.assertEqual(len(others), 1, "one row for the other native releases")
        self.assertIn(f"`{Mode.NATIVE.value}`", listed[others[0]])

    def test_fixes_column_matches_the_registry(self):
        from torch_subclass_rt.patching.registry import select
        from torch_subclass_rt.points import all_points

        known = all_points()
        for row in self.rows:
            version = row[0].strip("`")
            if version not in (*_torch_compat.BACKPORT_VERSIONS, *_torch_compat.FIXES_VERSIONS):
                continue
            mode = tsrt._choose_mode(version, False)
            carried = {_fix_key(p.upstream_fix) for p in select(known, version, mode, frozenset())
                       if p.upstream_fix}
            if version in _torch_compat.BACKPORT_VERSIONS:
                carried.add(FEATURE)
            for key in carried:
                self.assertIn(key, row[2], f"torch {version}: README's row omits {key}")
            shown = set(re.findall(r"(?:PR|issue) \d+|torch \d+\.\d+\.\d+ [\w-]+ check", row[2]))
            self.assertEqual(shown - carried, set(),
                             f"torch {version}: README names fixes the registry does not carry")


class TestFixesPage(unittest.TestCase):
    """docs/fixes.md has a section per upstream fix a point carries, naming
    every point that carries it and the test class of every test that
    guards one."""

    def test_each_fix_has_its_section(self):
        from torch_subclass_rt.points import all_points

        text = (ROOT / "docs" / "fixes.md").read_text()
        sections: dict[str, str] = {}
        for part in re.split(r"^## ", text, flags=re.M)[1:]:
            heading, _, body = part.partition("\n")
            sections[heading.strip()] = body
        problems = []
        for p in all_points():
            if not p.upstream_fix:
                continue
            key = _fix_key(p.upstream_fix)
            body = next((b for h, b in sections.items() if h.startswith(key)), None)
            if body is None:
                problems.append(f"no section '## {key}' (point {p.name})")
                continue
            if f"`{p.name}`" not in body:
                problems.append(f"## {key} does not name point {p.name}")
            for test in p.guarded_by:
                # a test class stands for its tests
                where = "::".join(test.split("::")[:2])
                if where not in body:
                    problems.append(f"## {key} does not name {p.name}'s test {where}")
        self.assertEqual(problems, [], "\n".join(problems))


# --- docs/errors.md ---------------------------------------------------------


class ShardTensor:
    """Stands for a user's subclass: the messages read only its class name."""

    __module__ = "mylib.sharding"


class MeshHandle:
    __module__ = "mylib.sharding"


class SizeStore:
    __module__ = "mylib.sharding"


def _message(exc: BaseException) -> str:
    return str(exc)


def _unsupported_torch() -> str:
    try:
        tsrt._choose_mode("2.9.1", False)
    except tsrt.UnsupportedTorchVersion as e:
        return str(e)
    raise AssertionError("torch 2.9.1 was accepted")


def _force_refused() -> str:
    try:
        tsrt._choose_mode("2.14.1", True)
    except tsrt.UnsupportedTorchVersion as e:
        return str(e)
    raise AssertionError("force=True on 2.14.1 was accepted")


def _dtensor_refused() -> str:
    try:
        tsrt._check_groups_exist("2.10.0", frozenset({"dtensor"}), [])
    except ValueError as e:
        return str(e)
    raise AssertionError("dtensor=True without the group was accepted")


def _compiled_autograd_2_10() -> str:
    from types import SimpleNamespace

    from torch_subclass_rt.runtime.meta import OpaqueMeta

    meta = SimpleNamespace(attrs={"_local": SimpleNamespace(), "mesh": OpaqueMeta()},
                           original_subclass_type=ShardTensor)
    return str(errors.compiled_autograd_opaque_error(
        SimpleNamespace(subclass_inp_meta=[meta]), [MeshHandle()]))


def _bad_typ() -> str:
    try:
        tsrt.register_opaque(MeshHandle, typ="mutable")
    except ValueError as e:
        return str(e)
    raise AssertionError("typ='mutable' was accepted")


#: anchor in docs/errors.md -> the message the package builds for the example
ERROR_MESSAGES = {
    "value-opaque-in-tensor-attrs": lambda: _message(
        errors.value_opaque_in_tensor_attrs_error(SizeStore, ShardTensor(), "sizes")),
    "unregistered-object-in-tensor-attrs": lambda: _message(
        errors.unregistered_object_in_tensor_attrs_error(ShardTensor(), "mesh", MeshHandle())),
    "unregistered-opaque-member": lambda: _message(
        errors.unregistered_opaque_member_error(MeshHandle, "get_group", ["ndim", "size"])),
    "compiled-autograd-on-2-10": _compiled_autograd_2_10,
    "unsupported-torch": _unsupported_torch,
    "force-refused": _force_refused,
    "dtensor-refused-on-2-10": _dtensor_refused,
    "register-opaque-typ": _bad_typ,
}


def _doc_blocks(text: str) -> dict[str, tuple[int, int]]:
    """anchor -> (first, end) line indexes of the ```text block that follows
    its ``<!-- message: anchor -->`` marker."""
    lines = text.splitlines()
    blocks = {}
    for i, line in enumerate(lines):
        m = re.match(r"<!-- message: ([\w-]+) -->", line.strip())
        if not m:
            continue
        start = i + 1
        assert lines[start].startswith("```"), f"line {start + 1}: a ``` block must follow"
        end = next(j for j in range(start + 1, len(lines)) if lines[j].startswith("```"))
        blocks[m.group(1)] = (start + 1, end)
    return blocks


def _wrap(message: str, width: int = 88) -> list[str]:
    import textwrap

    return textwrap.wrap(message, width, break_long_words=False, break_on_hyphens=False)


class TestErrorsPage(unittest.TestCase):
    path = ROOT / "docs" / "errors.md"

    def test_messages_match_the_code(self):
        text = self.path.read_text()
        blocks = _doc_blocks(text)
        lines = text.splitlines()
        if ACCEPT:
            for anchor in sorted(blocks, key=lambda a: -blocks[a][0]):
                first, end = blocks[anchor]
                if anchor in ERROR_MESSAGES:
                    lines[first:end] = _wrap(ERROR_MESSAGES[anchor]())
            self.path.write_text("\n".join(lines) + "\n")
            blocks = _doc_blocks(self.path.read_text())
            lines = self.path.read_text().splitlines()
        self.assertEqual(sorted(blocks), sorted(ERROR_MESSAGES),
                         "docs/errors.md's message markers and this test's list differ")
        for anchor, build in ERROR_MESSAGES.items():
            first, end = blocks[anchor]
            shown = " ".join(lines[first:end])
            self.assertEqual(shown, " ".join(_wrap(build())),
                             f"docs/errors.md#{anchor} shows another message than the code builds "
                             "(EXPECTTEST_ACCEPT=1 rewrites it)")
            self.assertIn(anchor, anchors(self.path), f"no heading or <a id> for {anchor}")

    def test_every_runtime_error_is_documented(self):
        factories = {n for n in dir(errors) if n.endswith("_error") and not n.startswith("_")}
        text = self.path.read_text()
        missing = [n for n in factories if f"`{n}`" not in text]
        self.assertEqual(missing, [], "errors.py builds errors docs/errors.md does not name")


if __name__ == "__main__":
    unittest.main()
