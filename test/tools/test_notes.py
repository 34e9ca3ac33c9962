"""Every ``Note [X]`` the package, tools, tests and docs name is defined
exactly once, in torch's form: the line ``Note [X]`` (in a comment or a
docstring) underlined by a line of ``~``::

    # Note [Install order of stacked points]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Any other mention is a reference. The patch series (patches/) is torch's
text and defines its own notes; it is not read here."""

from __future__ import annotations

import re
import subprocess
import unittest
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READ = ("torch_subclass_rt", "tools", "test", "benchmarks", "docs", "CONTRIBUTING.md", "noxfile.py")
SUFFIXES = (".py", ".md")
NOTE = re.compile(r"Note \[([^\]]+)\]")
#: mentions that are no note (file -> names)
NOT_NOTES = {
    # a fixture's text: series_map must see a comment added to a class
    "test/series/test_series_map.py": {"C"},
}


def _files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--", *READ], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [
        ROOT / f
        for f in listed
        # this file's examples are no notes
        if f.endswith(SUFFIXES) and (ROOT / f).is_file() and f != "test/tools/test_notes.py"
    ]


def _strip(line: str) -> str:
    return line.strip().lstrip("#").strip().lstrip('"').strip()


def scan(files: list[Path]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    defs: dict[str, list[str]] = defaultdict(list)
    refs: dict[str, list[str]] = defaultdict(list)
    for path in files:
        rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
        lines = path.read_text().split("\n")
        for i, line in enumerate(lines):
            for m in NOTE.finditer(line):
                name = m.group(1)
                if name in NOT_NOTES.get(rel, ()):
                    continue
                below = _strip(lines[i + 1]) if i + 1 < len(lines) else ""
                header = _strip(line) == m.group(0)
                if header and below and set(below) == {"~"}:
                    defs[name].append(f"{rel}:{i + 1}")
                else:
                    refs[name].append(f"{rel}:{i + 1}")
    return defs, refs


class TestNotes(unittest.TestCase):
    def test_every_note_is_defined_once(self):
        defs, refs = scan(_files())
        self.assertGreater(len(defs), 10)
        problems = [
            f"Note [{name}]: {len(defs[name])} definitions {defs[name]}, referenced at "
            f"{refs[name][:3]}"
            for name in sorted(set(defs) | set(refs))
            if len(defs[name]) != 1
        ]
        self.assertEqual(problems, [], "\n".join(problems))

    def test_scan_tells_a_definition_from_a_reference(self):
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "m.py"
            path.write_text(
                "# Note [A]\n# ~~~~~~~~\n# why\n"
                "x = 1  # Note [A]\n"
                '"""Note [B]: not a definition"""\n'
                "    Note [C]\n    ~~~~~~~~\n"
            )
            defs, refs = scan([path])
        self.assertEqual(sorted(defs), ["A", "C"])
        self.assertEqual(sorted(refs), ["A", "B"])


if __name__ == "__main__":
    unittest.main()
