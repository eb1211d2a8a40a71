"""A file a run reads but did not write is data: nothing in train/ unpickles one. torch.load is called only with
weights_only=True (its restricted unpickler), and pickle, dill, joblib and numpy's allow_pickle never appear."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

UNPICKLERS = {"pickle", "dill", "joblib", "cloudpickle", "marshal", "shelve"}


def calls(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def name_of(function: ast.expr) -> str:
    """``torch.load`` for ``torch.load(...)``, ``load`` for a bare ``load(...)``."""
    if isinstance(function, ast.Attribute):
        return f"{name_of(function.value)}.{function.attr}"
    return function.id if isinstance(function, ast.Name) else ""


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def problems(source: str) -> list[str]:
    """What in ``source`` could unpickle a file, one line each."""
    tree, found = ast.parse(source), []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found += [f"line {node.lineno}: imports {n}" for n in names if n.split(".")[0] in UNPICKLERS]
    for call in calls(tree):
        name = name_of(call.func)
        if name.endswith("torch.load") or name == "load" and keyword(call, "weights_only") is not None:
            safe = keyword(call, "weights_only")
            if not (isinstance(safe, ast.Constant) and safe.value is True):
                found.append(f"line {call.lineno}: {name}(...) without weights_only=True")
        allow = keyword(call, "allow_pickle")
        if allow is not None and not (isinstance(allow, ast.Constant) and allow.value is False):
            found.append(f"line {call.lineno}: {name}(..., allow_pickle=...)")
    return found


@pytest.mark.parametrize("path", sorted((REPO / "train").rglob("*.py")), ids=lambda p: str(p.relative_to(REPO)))
def test_nothing_in_train_unpickles_a_file(path: Path) -> None:
    assert problems(path.read_text(encoding="utf-8")) == []


def test_the_check_finds_each_way_back() -> None:
    """The scan itself: each way an unpickling could come back is found, the safe load is not."""
    assert problems("import torch\ntorch.load(path, weights_only=False)") == [
        "line 2: torch.load(...) without weights_only=True"
    ]
    assert problems("import torch\ntorch.load(path)") == ["line 2: torch.load(...) without weights_only=True"]
    assert problems("import pickle\n") == ["line 1: imports pickle"]
    assert problems("from dill import load\n") == ["line 1: imports dill"]
    assert problems("import numpy as np\nnp.load(path, allow_pickle=True)") == [
        "line 2: np.load(..., allow_pickle=...)"
    ]
    assert problems("import torch\ntorch.load(path, weights_only=True, map_location='cpu')") == []
