"""The documentation stays true: every setting the code reads is in the configuration
reference with its real default and minimum, every relative link resolves, and no file
points at a path outside the repository (a user's clone has nothing there)."""

from __future__ import annotations

import ast
import operator
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import REPO_ROOT

PACKAGES = ("meridian", "fleet", "console", "ops", "core", "routing", "workers", "sim")
ENV_READERS = {"env_str", "env_bool", "env_int", "env_float", "env_list", "env_map"}
CONFIGURATION = REPO_ROOT / "docs" / "configuration.md"
# Documented there but read by the test suite and make, not by Meridian's packages.
TEST_ONLY_VARIABLES = {"CI", "PYTEST_ARGS"}


class NotLiteral:
    """A default computed at run time (another setting, a path): not checked."""

    def __repr__(self) -> str:
        return "<computed>"


COMPUTED = NotLiteral()


@dataclass(frozen=True)
class EnvRead:
    name: str
    default: object
    minimum: object
    where: str


_ARITHMETIC: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
}


def _value(node: ast.expr | None) -> object:
    """The literal value of ``node`` (constants, lists, ``4 * 1024``), else COMPUTED."""
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List):
        items = [_value(item) for item in node.elts]
        return COMPUTED if COMPUTED in items else items
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _value(node.left), _value(node.right)
        if isinstance(left, int | float) and isinstance(right, int | float):
            return _ARITHMETIC[type(node.op)](left, right)
    return COMPUTED


def _read_name(call: ast.Call) -> str | None:
    """The variable name when ``call`` reads the environment, else None."""
    func = call.func
    reader = isinstance(func, ast.Name) and func.id in ENV_READERS
    getenv = isinstance(func, ast.Attribute) and func.attr == "getenv"
    environ_get = (
        isinstance(func, ast.Attribute)
        and func.attr == "get"
        and isinstance(func.value, ast.Attribute)
        and func.value.attr == "environ"
    )
    if not (reader or getenv or environ_get):
        return None
    first = call.args[0] if call.args else None
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def env_reads() -> list[EnvRead]:
    reads = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Call) or (name := _read_name(node)) is None:
                    continue
                minimum = next((k.value for k in node.keywords if k.arg == "minimum"), None)
                default = node.args[1] if len(node.args) > 1 else None
                where = f"{path.relative_to(REPO_ROOT)}:{node.lineno}"
                reads.append(EnvRead(name, _value(default), _value(minimum), where))
    return reads


# | `NAME` | default | minimum | meaning |
ROW = re.compile(r"^\| `([A-Z][A-Z0-9_]*)` \| ([^|]*) \| ([^|]*) \| ([^|]*) \|$", re.MULTILINE)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def documented_rows() -> dict[str, list[tuple[str, str]]]:
    rows: dict[str, list[tuple[str, str]]] = {}
    for name, default, minimum, _ in ROW.findall(CONFIGURATION.read_text()):
        rows.setdefault(name, []).append((default.strip(), minimum.strip()))
    return rows


def _first_number(cell: str) -> float | None:
    match = NUMBER.match(cell)
    return float(match.group().replace(",", "")) if match else None


def default_is_documented(value: object, cell: str) -> bool:
    if value is COMPUTED:
        return True
    if isinstance(value, bool):
        return cell.split()[0] == str(value).lower()
    if isinstance(value, int | float):
        return _first_number(cell) == float(value)
    if value == "" or value == [] or value is None:
        return cell.startswith("empty")
    if isinstance(value, list):
        return f"`{','.join(map(str, value))}`" in cell
    return f"`{value}`" in cell


def test_every_environment_variable_is_documented_with_its_default() -> None:
    reads = env_reads()
    assert len({r.name for r in reads}) > 60  # the scan itself works
    rows = documented_rows()
    problems = []
    for read in reads:
        documented = rows.get(read.name, [])
        if len(documented) != 1:
            problems.append(f"{read.name} ({read.where}): {len(documented)} rows, want 1")
            continue
        default, minimum = documented[0]
        if not default_is_documented(read.default, default):
            problems.append(f"{read.name} ({read.where}): default {read.default!r}, doc {default}")
        wanted = "—" if read.minimum is None else read.minimum
        if (_first_number(minimum) if read.minimum is not None else minimum) != wanted:
            problems.append(f"{read.name} ({read.where}): minimum {wanted!r}, doc {minimum}")
    assert problems == []


def test_one_variable_is_read_with_one_default_everywhere() -> None:
    seen: dict[str, EnvRead] = {}
    disagreeing = []
    for read in env_reads():
        first = seen.setdefault(read.name, read)
        if (first.default, first.minimum) != (read.default, read.minimum):
            disagreeing.append(f"{read.name}: {first.where} and {read.where}")
    assert disagreeing == []


def test_the_configuration_reference_documents_only_variables_that_are_read() -> None:
    read = {r.name for r in env_reads()}
    assert sorted(set(documented_rows()) - read - TEST_ONLY_VARIABLES) == []


def markdown_files() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def relative_links(path: Path) -> Iterator[str]:
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            yield target


def test_every_relative_link_points_at_a_file_in_the_repository() -> None:
    files = markdown_files()
    assert len(files) > 10
    broken = []
    for path in files:
        for target in relative_links(path):
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(REPO_ROOT)}: {target}"
            if not resolved.is_relative_to(REPO_ROOT) or not resolved.exists():
                broken.append(where)
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{where} (no such heading)")
    assert broken == []


# Shared material that sits beside the checkout on one machine, never in a user's clone.
OUTSIDE_PATHS = (b"../shared", b"/work/")
SKIPPED_DIRS = {".git", ".venv", "var", "__pycache__", "build", "dist"}


def repository_files() -> list[Path]:
    """Tracked files; without git (an unpacked archive), every file but build output."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return [
            p
            for p in REPO_ROOT.rglob("*")
            if p.is_file()
            and not SKIPPED_DIRS.intersection(p.relative_to(REPO_ROOT).parts)
            and not any(part.endswith(".egg-info") for part in p.parts)
        ]
    return [REPO_ROOT / name for name in listed.decode().split("\0") if name]


def test_no_file_refers_to_a_path_outside_the_repository() -> None:
    files = [p for p in repository_files() if p.resolve() != Path(__file__).resolve()]
    assert any(p.name == "README.md" for p in files)
    offending = []
    for path in files:
        if not path.is_file():  # deleted in the work tree, not yet committed
            continue
        content = path.read_bytes()
        if b"\0" in content:  # screenshots and other binaries
            continue
        offending += [
            f"{path.relative_to(REPO_ROOT)}: {needle.decode()}"
            for needle in OUTSIDE_PATHS
            if needle in content
        ]
    assert offending == []
