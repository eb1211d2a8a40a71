"""The house as docs/development.md draws it: train/'s packages import one way (a package only from the packages to
its left), no import of our own modules hides inside a function, no module of train/ or bench/ outgrows one
sitting (400 lines), and no module outside train/borrowed/ touches a library's private name."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from tests.conftest import REPO

# The order of docs/development.md's module map: a package may import the packages before it, never after.
ORDER = [
    "borrowed",
    "common",
    "machine",
    "config",
    "outputs",
    "data",
    "model",
    "report",
    "publish",
    "run",
    "commands",
    "launch",
    "doctor",
]
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


MAX_PARAMETERS = 6  # more, and related ones belong together in a dataclass


def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """A function's parameters, positional and keyword (``*args``/``**kwargs`` and a method's self/cls left out)."""
    arguments = function.args
    names = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


@pytest.mark.parametrize("path", modules("train"), ids=lambda p: str(p.relative_to(REPO)))
def test_no_function_takes_more_than_six_parameters(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    over = [
        f"{f.name} (line {f.lineno}): {len(parameters(f))}" for f in functions if len(parameters(f)) > MAX_PARAMETERS
    ]
    assert not over, f"{path}: more than {MAX_PARAMETERS} parameters (group related ones in a dataclass): {over}"


# What we borrow from libraries' internals lives in train/borrowed/ (one module per library, each touch with its
# version and a canary in tests/borrowed/): everywhere else, a name that starts with one underscore and is not ours
# is out of reach. The rule, without an allow-list:
# - no import of a private module or name from a library (``from torch.x._y import z``, ``from x import _Y``);
# - no ``x._name`` whatever ``x`` is, but ``self``/``cls`` (below) and a module that lists the name in its
#   ``__all__`` (``os._exit``): our own code keeps its private names to itself as well;
# - no ``getattr``/``setattr``/``hasattr``/``delattr`` of a literal ``"_name"``;
# - in a class of ours that subclasses a library's: no ``def _name`` that overrides one of the library's, and no
#   ``self._name`` the library's classes define or assign (``self._train_batch_size``).
OURS = ("train", "bench", "tools", "tests")
ATTRIBUTE_CALLS = ("getattr", "setattr", "hasattr", "delattr")


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def ours(module: str) -> bool:
    return module.split(".")[0] in OURS


def imported_modules(tree: ast.AST) -> dict[str, str]:
    """The names ``import x`` / ``import x.y as z`` bind to a library's module, and that module's name."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not ours(alias.name):
                    bound[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
    return bound


def exported(module: str, name: str) -> bool:
    """``name`` is in ``module``'s ``__all__``: the library calls it public despite its underscore."""
    try:
        return name in getattr(importlib.import_module(module), "__all__", ())
    except ImportError:
        return False


def private_touches(path: Path) -> list[str]:
    """Where ``path`` reaches a private name by import, attribute or a literal name (see above)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules, found = imported_modules(tree), []
    for node in ast.walk(tree):
        where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and node.module and not node.level and not ours(node.module):
            if any(private(part) for part in node.module.split(".")) or any(private(a.name) for a in node.names):
                found.append(f"{where}: {ast.unparse(node)}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if not ours(alias.name) and any(private(part) for part in alias.name.split(".")):
                    found.append(f"{where}: {ast.unparse(node)}")
        elif isinstance(node, ast.Attribute) and private(node.attr):
            value = node.value
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                continue
            if isinstance(value, ast.Name) and value.id in modules and exported(modules[value.id], node.attr):
                continue
            found.append(f"{where}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ATTRIBUTE_CALLS:
            if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                if private(node.args[1].value):
                    found.append(f"{where}: {ast.unparse(node)}")
    return found


def _source(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return ""


def library_overrides(path: Path) -> list[str]:
    """In ``path``'s classes that subclass a library's: ``def _name`` overriding the library's, ``self._name`` that
    the library's classes define or assign."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.bases]
    if not classes:
        return []
    name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
    module, found = importlib.import_module(name), []
    for node in classes:
        cls = vars(module).get(node.name)
        if not isinstance(cls, type):
            continue
        library = [b for b in cls.__mro__[1:] if b is not object and not ours(b.__module__)]
        if not library:
            continue
        sources = [_source(b) for b in library]
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and private(item.name):
                if any(item.name in vars(b) for b in library):
                    found.append(
                        f"{path.relative_to(REPO)}:{item.lineno}: {node.name}.{item.name} overrides a library's"
                    )
        for inner in ast.walk(node):
            if not (isinstance(inner, ast.Attribute) and private(inner.attr) and isinstance(inner.value, ast.Name)):
                continue
            if inner.value.id in ("self", "cls") and (
                any(inner.attr in vars(b) for b in library) or any(f"self.{inner.attr}" in s for s in sources)
            ):
                found.append(f"{path.relative_to(REPO)}:{inner.lineno}: {ast.unparse(inner)} is the library's")
    return found


NOT_BORROWED = [
    p
    for p in [*modules("train"), *modules("bench"), *modules("tools")]
    if p.relative_to(REPO).parts[:2] != ("train", "borrowed")
]


@pytest.mark.parametrize("path", NOT_BORROWED, ids=lambda p: str(p.relative_to(REPO)))
def test_only_borrowed_touches_private_names(path: Path) -> None:
    found = private_touches(path) + library_overrides(path)
    assert not found, "a library's private name outside train/borrowed/ (move it there, with a canary):\n" + "\n".join(
        found
    )
