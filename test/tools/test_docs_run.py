"""Every Python block in README.md, CONTRIBUTING.md and docs/ that is meant
to run, runs as written on the torch under test.

A block is a program unless the line before its fence is a comment saying
why it is not, ``<!-- fragment: <why> -->`` (a method shown alone, a
before/after pair, an elided body). A program runs in a fresh interpreter
with this repository importable and nothing installed beforehand: what it
does (``tsrt.install()``, registering, compiling) is what a reader's copy
does. The matrix runs this file on every release it tests.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")])
_FRAGMENT = re.compile(r"^<!--\s*fragment:\s*(.*?)\s*-->$")


def python_blocks(path: Path) -> list[tuple[int, str, str | None]]:
    """(line of the fence, code, why it is a fragment or None) of each
    ``python`` block of ``path``."""
    lines = path.read_text().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            match = _FRAGMENT.match(before)
            i += 1
            body = []
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append((start + 1, "\n".join(body) + "\n", match.group(1) if match else None))
        i += 1
    return blocks


class TestPythonBlocksRun(unittest.TestCase):
    def test_fragments_say_why(self):
        for path in DOC_FILES:
            for line, _code, why in python_blocks(path):
                if why is not None:
                    self.assertTrue(why, f"{path.name}:{line}: a fragment comment gives no reason")

    def test_programs_run_as_written(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TSRT_")}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        ran = 0
        for path in DOC_FILES:
            for line, code, why in python_blocks(path):
                if why is not None:
                    continue
                with self.subTest(block=f"{path.relative_to(ROOT)}:{line}"):
                    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT,
                                          capture_output=True, text=True, timeout=600)
                    self.assertEqual(proc.returncode, 0,
                                     f"{path.relative_to(ROOT)}:{line} failed:\n{proc.stderr[-3000:]}")
                ran += 1
        self.assertGreater(ran, 0, "no Python block of the docs is a program")

    def test_a_fragment_is_marked(self):
        # the parser itself: an unmarked block is a program, a marked one is not
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "x.md"
            p.write_text("text\n\n<!-- fragment: a method alone -->\n```python\ndef f(self): ...\n```\n"
                         "\n```python\nprint(1)\n```\n")
            self.assertEqual(python_blocks(p), [(4, "def f(self): ...\n", "a method alone"),
                                                (8, "print(1)\n", None)])


if __name__ == "__main__":
    unittest.main()
