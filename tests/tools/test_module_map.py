"""docs/development.md's module map against the tree, as tools/options.py --check holds docs/options.md to the
schema: every package of train/ has its row, every module of a package is named in that row (`name.py`, one of a
package inside it `inner/name.py`; a package's __init__.py and __main__.py may go unnamed), every module a row
names exists, and the import order the map draws is the one tests/test_layout.py enforces."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_layout import ORDER

REPO = Path(__file__).resolve().parents[2]
MAP = REPO / "docs" / "development.md"
ROW = re.compile(r"^\| `train/(\w+)/` \|(.*)\|\s*$")
MODULE = re.compile(r"`((?:\w+/)*\w+\.py)`")
UNNAMED = {"__init__.py", "__main__.py"}


def rows(text: str) -> dict[str, set[str]]:
    """Each package's row of the map: the module files it names."""
    found: dict[str, set[str]] = {}
    for line in text.splitlines():
        if match := ROW.match(line):
            assert match[1] not in found, f"two rows for train/{match[1]}/"
            found[match[1]] = set(MODULE.findall(match[2]))
    return found


def problems(text: str, train: Path) -> list[str]:
    """What the map says that the tree under ``train`` does not, and what the tree holds that the map leaves out."""
    named = rows(text)
    packages = {p.name for p in train.iterdir() if (p / "__init__.py").is_file()}
    found = [f"train/{p}/: no row in the module map" for p in sorted(packages - set(named))]
    found += [f"train/{p}/: a row for a package that does not exist" for p in sorted(set(named) - packages)]
    for package in sorted(packages & set(named)):
        modules = {p.relative_to(train / package).as_posix() for p in (train / package).rglob("*.py")}
        unnamed = {m for m in modules - named[package] if m.rsplit("/", 1)[-1] not in UNNAMED}
        found += [f"train/{package}/{m}: not named in its row" for m in sorted(unnamed)]
        found += [f"train/{package}/{m}: named in the map, no such module" for m in sorted(named[package] - modules)]
    return found


def drawn_order(text: str) -> list[str]:
    """The packages of the map's import line (``borrowed <- common <- machine <- ...``), left to right."""
    line = next(line for line in text.splitlines() if line.startswith("    ") and " <- " in line)
    return [name.strip() for step in line.split("<-") for name in step.split(",")]


def test_the_module_map_is_the_tree() -> None:
    assert problems(MAP.read_text(encoding="utf-8"), REPO / "train") == []


def test_the_maps_import_order_is_the_one_enforced() -> None:
    assert drawn_order(MAP.read_text(encoding="utf-8")) == ORDER


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda t: t.replace("`hub_auth.py` (", "`hub_auth` ("), "train/common/hub_auth.py: not named in its row"),
        (
            lambda t: t.replace("`hub_auth.py`", "`hub_oauth.py`"),
            "train/common/hub_oauth.py: named in the map, no such module",
        ),
        (lambda t: re.sub(r"^\| `train/doctor/`.*\n", "", t, flags=re.M), "train/doctor/: no row in the module map"),
    ],
)
def test_a_stale_map_is_caught(change, said: str) -> None:
    stale = change(MAP.read_text(encoding="utf-8"))
    assert said in problems(stale, REPO / "train")
