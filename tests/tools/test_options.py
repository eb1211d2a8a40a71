"""docs/options.md's option table: generated from the schema, and a stale one is caught."""

from __future__ import annotations

from pathlib import Path

from tools.options import BEGIN, END, main, render
from train.config import BOUNDS, option_rows

REPO = Path(__file__).resolve().parents[2]
OPTIONS_DOC = REPO / "docs" / "options.md"


def test_the_option_table_is_current() -> None:
    assert main(["--check", str(OPTIONS_DOC)]) == 0


def test_stale_table_is_detected(tmp_path: Path) -> None:
    stale = tmp_path / "options.md"
    text = OPTIONS_DOC.read_text().replace("`MLM_DEMO_SAMPLES`", "`MLM_DEMO_SAMPLEZ`")
    stale.write_text(text)
    assert main(["--check", str(stale)]) == 1
    assert main(["--write", str(stale)]) == 0 and main(["--check", str(stale)]) == 0


def test_the_begin_marker_is_rewritten_whatever_its_note_said() -> None:
    old = "intro\n<!-- options:begin (generated from train/config.py) -->\nold table\n<!-- options:end -->\noutro\n"
    fresh = render(old)
    assert fresh.startswith(f"intro\n{BEGIN}\n| option |") and fresh.endswith(f"{END}\noutro\n")
    assert "old table" not in fresh


def test_rows_show_each_options_bound() -> None:
    rows = {name: help_text for name, _, _, help_text in option_rows(job_only=True)}
    assert rows["max_seq_length"].endswith(f"Accepts {BOUNDS['max_seq_length'].expected}.")
    assert rows["seed"].endswith(f"Accepts {BOUNDS['seed'].expected}.")  # a TrainingArguments field we changed
