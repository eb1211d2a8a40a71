"""docs/models.md's model table: generated from what the code does with each architecture, and a stale one is caught."""

from __future__ import annotations

from pathlib import Path

from tools.models import main

REPO = Path(__file__).resolve().parents[2]
MODELS_DOC = REPO / "docs" / "models.md"


def test_the_model_table_is_current() -> None:
    assert main(["--check", str(MODELS_DOC)]) == 0


def test_a_stale_row_is_detected(tmp_path: Path) -> None:
    stale = tmp_path / "models.md"
    stale.write_text(MODELS_DOC.read_text().replace("| deberta-v2 | eager |", "| deberta-v2 | sdpa |"))
    assert main(["--check", str(stale)]) == 1
    assert main(["--write", str(stale)]) == 0 and main(["--check", str(stale)]) == 0
