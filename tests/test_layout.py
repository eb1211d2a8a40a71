"""The house as docs/development.md draws it: train/'s packages import one way (a package only from the packages to
its left), no import of our own modules hides inside a function, and no module of train/ or bench/ outgrows one
sitting (400 lines)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

# The order of docs/development.md's module map: a package may import the packages before it, never after.
ORDER = ["common", "machine", "config", "outputs", "data", "model", "report", "publish", "run", "launch", "doctor"]
MAX_LINES = 400


def modules(folder: str) -> list[Path]:
    return sorted((REPO / folder).rglob("*.py"))


def package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "train" else None


def imports(path: Path) -> list[tuple[ast.stmt, str]]:
    """Every ``train.*`` module ``path`` imports, with the statement (``from train import x`` names ``train.x``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node, alias.name) for alias in node.names if alias.name.startswith("train.")]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "train":
                found += [(node, f"train.{alias.name}") for alias in node.names]
            elif node.module.startswith("train."):
                found.append((node, node.module))
    return found


@pytest.mark.parametrize("path", modules("train"), ids=lambda p: str(p.relative_to(REPO)))
def test_imports_point_one_way(path: Path) -> None:
    here = path.relative_to(REPO / "train").parts
    if len(here) == 1:
        return  # train/__main__.py: the front door may call any package
    rank = ORDER.index(here[0])
    for node, module in imports(path):
        target = package_of(module)
        assert target in ORDER, f"{path.name}:{node.lineno} imports {module}, in no package of the map"
        assert ORDER.index(target) <= rank, f"{path}:{node.lineno}: {here[0]} imports {module} (runs back up)"


@pytest.mark.parametrize("path", [*modules("train"), *modules("bench"), *modules("tools")], ids=str)
def test_our_modules_are_imported_at_the_top(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    tree = ast.parse("\n".join(lines))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node.col_offset > 0:
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if not any(name.split(".")[0] in ("train", "bench", "tools") for name in names):
                continue  # a library's own import, kept lazy for its cost
            assert says_why(lines, node.lineno), (
                f"{path}:{node.lineno}: imports {names[0]} inside a function without saying why"
            )


def says_why(lines: list[str], lineno: int) -> bool:
    """A comment on the import's line, or above it in its block of imports and comments."""
    index = lineno - 1
    while index >= 0:
        line = lines[index].strip()
        if "#" in line:
            return True
        if not line.startswith(("from ", "import ")):
            return False
        index -= 1
    return False


@pytest.mark.parametrize("path", [*modules("train"), *modules("bench")], ids=str)
def test_no_module_outgrows_one_sitting(path: Path) -> None:
    assert len(path.read_text(encoding="utf-8").splitlines()) <= MAX_LINES
