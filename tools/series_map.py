#!/usr/bin/env python3
"""The map between the patch points and the patch series, checked both ways.

    python tools/series_map.py [--version 2.11.0] [--torch-root PATH] [--patches-dir DIR]

Run it with the Python of the series' torch (the version defaults to it).

The backport (``torch_subclass_rt/points``) and the series
(``patches/v<version>/*.patch``) are the same change in two forms. Each
patch point says, as data, which series changes it stands for
(``PatchPoint.series``: ``"NNNN path::qualname"`` entries), or why it has
none (``series_none``), or that it only makes the backport faster
(``speed_only``). This tool computes what the series changes, unit by unit,
and checks:

* every change the series makes to a torch function (or class, or
  module-level statement) is claimed by a point, or listed in
  ``points.SERIES_WITHOUT_POINT`` with the reason it needs none;
* every series entry a point names is a change the series makes;
* every point that applies to this version and changes behaviour names at
  least one series entry; ``series_none`` is accepted only from a point
  that does not apply to this version (a forced-mode or native+fixes
  point). There is no list of points "not ported yet": a point that
  changes behaviour on a series' torch has its patch, or this check fails.

So adding a point without its series counterpart, or a hunk without its
point, fails (``test/series/test_series_map.py``). Without problems it prints the
map and exits 0; otherwise it prints each problem and exits 1.

How a change is located: the series is applied in memory, patch by patch,
to the installed torch's sources (the wheel the series is written against);
each removed line is mapped to the unit that encloses it in the file before
the patch, each added line to the unit in the file after it (Python's
``ast``). A unit is a module-level function or class, a method
(``Class.method``; functions nested deeper count as their enclosing one), a
class-level statement (``Class``), a module-level assignment (its target
names), ``<imports>`` for the import statements, or ``<module>`` for any
other module-level statement. Blank and comment lines outside any function
are not changes. An ``<imports>`` change in a file that the same patch also
changes elsewhere serves those changes and needs no point of its own.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools._common import PATCHES_ROOT, ToolError, main_wrapper, series, series_dir  # noqa: E402

# Note [One numbering for every series]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
#     The series for an older base is the newest series ported to it: its
#     patch N (N >= 0001) is patch N of patches/v2.11.0, with the same
#     subject, and the changes that base needs first (what 2.11 has and 2.10
#     lacks) are patch 0000. So one ``series`` entry names the same change
#     in every series it is in, and a point shared by 2.10 and 2.11 is
#     checked against both. The patches a series leaves out are declared
#     below; test/series/test_series_map.py checks the subjects line up.
#: per series version, the patches of the newest series it leaves out, and
#: why: a point entry naming one of them is not looked for in that series
LEFT_OUT_OF_SERIES: Mapping[str, Mapping[str, str]] = {
    "2.11.0": {"0000": "what torch 2.10 lacks and torch 2.11 has"},
    "2.10.0": {
        **{
            n: "callable value opaques on a subclass (PR 188799): the fix is "
            "for torch 2.11's Dynamo; 2.10 is left as shipped"
            for n in ("0010", "0011")
        },
        # DeviceMesh / ProcessGroup as opaques and derived submeshes (0012,
        # 0013, 0016, 0017) are carried: 0000 gives 2.10 the opaque members
        # (guard_fn, members=) they build on
        **{
            n: "DTensor with device_mesh as an inner attr (and its test): not "
            "ported, torch 2.10's DTensor is left as shipped (its mesh in the "
            "flatten context)"
            for n in ("0014", "0015")
        },
        "0023": "a real opaque a traced function returns (the mesh of a DTensor output "
        "while AOTAutograd traces over a Dynamo-compiled function): needs DTensor's "
        "mesh as an inner attr (0014), which 2.10 is left without",
        "0026": "attributes of a value-type opaque read in compiled code: torch 2.10's "
        "Dynamo treats a value opaque as a plain user object and reads them already "
        "(no FakeScriptObject for value types, which 2.11 added)",
    },
}

#: the only paths whose changes are mapped (the series' in-tree tests are not
#: torch functions)
MAPPED_PREFIX = "torch/"

_ENTRY_RE = re.compile(r"^(\d{4}) (\S+\.py)::(\S+)$")
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True, order=True)
class Change:
    """One unit of a torch file that one patch of the series changes."""

    patch: str  # "0001"
    path: str  # "torch/_functorch/_aot_autograd/subclass_utils.py"
    unit: str  # "create_subclass_metadata", "Class.method", "<imports>", ...
    new: bool = field(default=False, compare=False)  # the unit does not exist before

    @property
    def entry(self) -> str:
        return f"{self.patch} {self.path}::{self.unit}"


def parse_entry(entry: str) -> tuple[str, str, str]:
    m = _ENTRY_RE.match(entry)
    if not m:
        raise ValueError(
            f"series entry {entry!r} is not 'NNNN path/to/file.py::qualname' "
            "(e.g. '0001 torch/_functorch/_aot_autograd/subclass_utils.py::"
            "create_subclass_metadata')"
        )
    return m.group(1), m.group(2), m.group(3)


# --------------------------------------------------------------------------
# the series, applied in memory


@dataclass
class _FileDiff:
    old_path: str | None  # None for a new file
    new_path: str
    hunks: list[tuple[int, list[str]]]  # (old start line, body lines)


def parse_patch(text: str) -> list[_FileDiff]:
    """The per-file hunks of one ``git format-patch`` file.

    A hunk's body is read by the line counts of its header, so a body line
    that looks like mail syntax ("-- ", "diff --git") is still body.
    """
    diffs: list[_FileDiff] = []
    current: _FileDiff | None = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            current = None
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = line[4:], lines[i + 1][4:]
            current = _FileDiff(None if old == "/dev/null" else old[2:], new[2:], [])
            diffs.append(current)
            i += 1
        elif current is not None and line.startswith("@@"):
            m = _HUNK_RE.match(line)
            if not m:
                raise ToolError(f"unreadable hunk header {line!r}")
            old_left = int(m.group(2) or 1)
            new_left = int(m.group(4) or 1)
            body: list[str] = []
            while old_left > 0 or new_left > 0:
                i += 1
                if i >= len(lines):
                    raise ToolError(f"hunk {line!r} ends early")
                b = lines[i] or " "  # an empty context line may lose its space
                if b.startswith("\\"):
                    continue  # "\ No newline at end of file"
                if b[0] == "+":
                    new_left -= 1
                elif b[0] == "-":
                    old_left -= 1
                elif b[0] == " ":
                    old_left -= 1
                    new_left -= 1
                else:
                    raise ToolError(f"unexpected line {b!r} in hunk {line!r}")
                body.append(b)
            current.hunks.append((int(m.group(1)), body))
        elif line == "-- ":
            break  # a signature (format-patch without --no-signature)
        i += 1
    return diffs


def apply_file_diff(
    pre: list[str], diff: _FileDiff, where: str
) -> tuple[list[str], list[int], list[int]]:
    """(post-image, removed pre-image line numbers, added post-image line
    numbers), 1-based. The context must match exactly: the series is
    generated against these very sources."""
    post: list[str] = []
    removed: list[int] = []
    added: list[int] = []
    pos = 0  # lines of pre consumed
    for start, body in diff.hunks:
        # a hunk that adds to an empty file has old start 0
        target = max(start - 1, 0)
        if target < pos:
            raise ToolError(f"{where}: overlapping hunks at line {start}")
        post.extend(pre[pos:target])
        pos = target
        for line in body:
            tag, text = line[0], line[1:]
            if tag == "+":
                post.append(text)
                added.append(len(post))
                continue
            if pos >= len(pre) or pre[pos] != text:
                got = pre[pos] if pos < len(pre) else "<end of file>"
                raise ToolError(
                    f"{where}: line {pos + 1} does not match the patch "
                    f"(patch: {text!r}, file: {got!r}); is this the torch the "
                    "series is written against?"
                )
            if tag == "-":
                removed.append(pos + 1)
            else:
                post.append(text)
            pos += 1
    post.extend(pre[pos:])
    return post, removed, added


# --------------------------------------------------------------------------
# lines -> units


def _span(node: ast.stmt) -> tuple[int, int]:
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return first, node.end_lineno or node.lineno


def _stmt_unit(node: ast.stmt) -> str:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return "<imports>"
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    names = sorted({n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)})
    return ",".join(names) if names else "<module>"


def unit_index(source: str, where: str) -> list[tuple[int, int, str, bool]]:
    """(first line, last line, unit, is a function) for every unit of a
    module, innermost last: a method's span follows its class's."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ToolError(f"{where}: cannot parse ({e})") from e
    spans: list[tuple[int, int, str, bool]] = []
    funcs = (ast.FunctionDef, ast.AsyncFunctionDef)

    def module_level(body: Iterable[ast.stmt]) -> None:
        for node in body:
            # module-level if/try blocks (``if TYPE_CHECKING:``, ``else:`` of
            # an availability check) hold module-level definitions
            if isinstance(node, (ast.If, ast.Try)):
                module_level(node.body)
                module_level(node.orelse)
                if isinstance(node, ast.Try):
                    for h in node.handlers:
                        module_level(h.body)
                    module_level(node.finalbody)
                continue
            first, last = _span(node)
            spans.append((first, last, _stmt_unit(node), isinstance(node, funcs)))
            if isinstance(node, ast.ClassDef):
                for member in node.body:
                    if isinstance(member, funcs):
                        m_first, m_last = _span(member)
                        spans.append((m_first, m_last, f"{node.name}.{member.name}", True))

    module_level(tree.body)
    return spans


def unit_at(index: list[tuple[int, int, str, bool]], line: int) -> tuple[str, bool] | None:
    found = None
    for first, last, unit, is_function in index:
        if first <= line <= last:
            found = (unit, is_function)  # later spans are inner (a method after its class)
    return found


def _is_trivia(text: str) -> bool:
    stripped = text.strip()
    return not stripped or stripped.startswith("#")


def _changes_of(
    patch: str, path: str, pre: list[str], post: list[str], removed: list[int], added: list[int]
) -> set[Change]:
    pre_index = unit_index("\n".join(pre) + "\n", f"{patch} {path} (before)")
    post_index = unit_index("\n".join(post) + "\n", f"{patch} {path} (after)")
    before = {u for _, _, u, _ in pre_index}
    found: set[Change] = set()
    for lines, index, text in ((removed, pre_index, pre), (added, post_index, post)):
        for n in lines:
            hit = unit_at(index, n)
            if hit is None:
                continue  # a blank or comment line between module-level statements
            unit, is_function = hit
            if not is_function and _is_trivia(text[n - 1]):
                continue  # layout outside any function changes nothing
            found.add(Change(patch, path, unit, new=unit not in before))
    return found


def series_changes(
    patch_texts: Sequence[tuple[str, str]], read_original: Callable[[str], str | None]
) -> list[Change]:
    """Every unit of a torch file that each patch changes.

    ``patch_texts``: (patch number "0001", format-patch text) in series
    order. ``read_original(path)``: the file before the series (None if it
    does not exist there).
    """
    state: dict[str, list[str]] = {}
    changes: set[Change] = set()
    for number, text in patch_texts:
        for diff in parse_patch(text):
            path = diff.new_path
            if diff.old_path is None:
                pre: list[str] = []
            elif diff.old_path in state:
                pre = state[diff.old_path]
            else:
                original = read_original(diff.old_path)
                if original is None:
                    raise ToolError(f"{number}: {diff.old_path} does not exist in this torch")
                pre = original.splitlines()
            post, removed, added = apply_file_diff(pre, diff, f"{number} {path}")
            state[path] = post
            if path.startswith(MAPPED_PREFIX) and path.endswith(".py"):
                changes |= _changes_of(number, path, pre, post, removed, added)
    # imports that serve other changes of the same patch in the same file
    touched = {(c.patch, c.path) for c in changes if c.unit != "<imports>"}
    return sorted(c for c in changes if c.unit != "<imports>" or (c.patch, c.path) not in touched)


def read_series(directory: Path) -> list[tuple[str, str]]:
    out = []
    for p in series(directory):
        number = p.name[:4]
        if not number.isdigit():
            raise ToolError(f"{p}: a series patch name starts with its number (NNNN-...)")
        out.append((number, p.read_text()))
    if not out:
        raise ToolError(f"no *.patch files in {directory}")
    return out


# --------------------------------------------------------------------------
# the check


@dataclass
class MapResult:
    changes: list[Change]
    #: entry -> names of the points that claim it
    claimed_by: dict[str, list[str]]
    problems: list[str]


def check(
    points: Sequence,
    changes: Sequence[Change],
    without_point: Mapping[str, str],
    version: str,
    series_versions: Iterable[str] | None = None,
    left_out: Mapping[str, str] | None = None,
) -> MapResult:
    """Both directions of the map; ``points``: PatchPoint-like objects
    (name, versions, group, series, series_none, speed_only).
    ``series_versions``: the releases that have a series (default: this
    one); a point with entries must apply to one of them, and is checked
    against this series if it applies to ``version``. ``left_out``: patch
    numbers this series leaves out (Note [One numbering for every series])."""
    problems: list[str] = []
    by_entry = {c.entry: c for c in changes}
    claimed_by: dict[str, list[str]] = {}
    with_series = set(series_versions or ()) | {version}
    left_out = left_out or {}
    for p in points:
        applies = version in p.versions
        if p.series and not applies:
            if not (set(p.versions) & with_series):
                problems.append(
                    f"point {p.name}: names series entries but applies to no torch "
                    f"release with a patch series ({', '.join(sorted(with_series))})"
                )
            continue
        for entry in p.series:
            try:
                number, _, _ = parse_entry(entry)
            except ValueError as e:
                problems.append(f"point {p.name}: {e}")
                continue
            if number in left_out:
                continue
            if entry not in by_entry:
                problems.append(
                    f"point {p.name}: names '{entry}', which the v{version} series does "
                    "not change: port the point's change into that commit (CONTRIBUTING "
                    "step 3) or correct the entry (run tools/series_map.py for the map)"
                )
            claimed_by.setdefault(entry, []).append(p.name)
        if not applies or p.speed_only or p.series:
            continue
        if p.series_none:
            problems.append(
                f"point {p.name}: applies to torch {version} and changes behaviour, but "
                f"says it has no series counterpart ({p.series_none!r}): port it into "
                f"patches/v{version} (CONTRIBUTING.md, 'Points and the series') and name "
                "the entries in its `series`"
            )
        else:
            problems.append(
                f"point {p.name}: no series counterpart: name the series entries it "
                "corresponds to in `series`, or `speed_only` with its measured gain"
            )
    for entry, reason in without_point.items():
        if entry[:4] in left_out:
            continue  # a change of a patch this series does not have
        if entry not in by_entry:
            problems.append(
                f"SERIES_WITHOUT_POINT lists '{entry}', which the v{version} series does "
                "not change: remove or correct it"
            )
        elif entry in claimed_by:
            problems.append(
                f"'{entry}' is claimed by {', '.join(claimed_by[entry])} and also listed "
                "in SERIES_WITHOUT_POINT: keep one"
            )
        elif not reason.strip():
            problems.append(f"SERIES_WITHOUT_POINT['{entry}'] gives no reason")
    for c in changes:
        if c.entry not in claimed_by and c.entry not in without_point:
            problems.append(
                f"series change '{c.entry}'{' (new)' if c.new else ''} is covered by no "
                "patch point: add it to the `series` of the point that does the same, "
                "add the point, or list it in torch_subclass_rt/points/__init__.py "
                "SERIES_WITHOUT_POINT with the reason it needs none"
            )
    return MapResult(list(changes), claimed_by, problems)


def default_torch_root() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise ToolError(f"no importable torch package for {sys.executable}")
    return Path(list(spec.submodule_search_locations)[0])


def original_reader(torch_root: Path) -> Callable[[str], str | None]:
    base = torch_root.parent  # paths in the series start with torch/

    def read(path: str) -> str | None:
        f = base / path
        return f.read_text() if f.is_file() else None

    return read


def compute(
    version: str, torch_root: Path | None = None, patches_dir: Path | None = None
) -> MapResult:
    from torch_subclass_rt.points import SERIES_WITHOUT_POINT, all_points

    root = torch_root or default_torch_root()
    changes = series_changes(
        read_series(series_dir(version, patches_dir)), original_reader(root)
    )
    return check(
        all_points(), changes, SERIES_WITHOUT_POINT, version,
        series_versions=series_versions(), left_out=LEFT_OUT_OF_SERIES.get(version, {}),
    )


def series_versions() -> list[str]:
    """The torch releases that have a series (patches/v<version>/)."""
    return sorted(d.name[1:] for d in PATCHES_ROOT.glob("v*") if any(d.glob("*.patch")))


def format_map(result: MapResult, without_point: Mapping[str, str]) -> str:
    lines = []
    for c in result.changes:
        owners = result.claimed_by.get(c.entry)
        where = ", ".join(owners) if owners else f"no point: {without_point.get(c.entry, '?')}"
        lines.append(f"{c.entry}{' (new)' if c.new else ''}\n    -> {where}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", help="series version (default: the installed torch's)")
    parser.add_argument("--torch-root", type=Path, help="the torch package the series is against")
    parser.add_argument("--patches-dir", type=Path, help="another copy of the series")
    args = parser.parse_args(argv)
    from torch_subclass_rt.points import SERIES_WITHOUT_POINT

    if args.version is None:
        from torch_subclass_rt._torch_compat import torch_version

        args.version = torch_version()
    result = compute(args.version, args.torch_root, args.patches_dir)
    print(format_map(result, SERIES_WITHOUT_POINT))
    if result.problems:
        print(f"\n{len(result.problems)} problem(s):", file=sys.stderr)
        for p in result.problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    print(f"\nOK: {len(result.changes)} series changes, all mapped both ways")
    return 0


if __name__ == "__main__":
    main_wrapper(main)
