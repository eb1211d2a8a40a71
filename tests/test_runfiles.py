"""The layout of output_dir: names, and which directories count as checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

from train.outputs.runfiles import RunFiles, is_checkpoint_name, step_of


def test_the_layout() -> None:
    files = RunFiles("/out")
    assert files == RunFiles(Path("/out")) and files.root == Path("/out")
    assert [files.final, files.final_previous, files.run_json, files.all_results] == [
        Path("/out/final"), Path("/out/final.previous"), Path("/out/run.json"), Path("/out/all_results.json")
    ]  # fmt: skip
    assert files.train_jsonl == Path("/out/logs/train.jsonl") and files.report == Path("/out/report.html")
    assert files.checkpoint(20) == Path("/out/checkpoint-20") and step_of(files.checkpoint(20)) == 20
    assert files.aside(files.checkpoint(20), 7) == Path("/out/.invalid-checkpoint-20-7")


def test_checkpoints_are_numbered_directories_oldest_first(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    for name in (
        "checkpoint-100",
        "checkpoint-20",
        "checkpoint-3",
        "checkpoint-x",
        "checkpoint-",
        ".invalid-checkpoint-5-1",
    ):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint-7").write_text("a file, not a checkpoint")
    assert [p.name for p in files.checkpoints()] == ["checkpoint-3", "checkpoint-20", "checkpoint-100"]
    assert not is_checkpoint_name("checkpoint-") and not is_checkpoint_name("final")


def test_asides_newest_first(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    for age, name in enumerate([".invalid-checkpoint-1-9", ".invalid-checkpoint-2-9"]):
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (1000 + age, 1000 + age))
    assert [p.name for p in files.asides()] == [".invalid-checkpoint-2-9", ".invalid-checkpoint-1-9"]
