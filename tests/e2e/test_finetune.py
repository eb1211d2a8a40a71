"""./entrypoint.sh finetune end to end: the launcher, torchrun, one rank (the tiny model and task of
tests/commands/finetune/test_command.py; the run of tests/commands/finetune/test_series.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.commands.finetune.test_command import build_model, write_task
from tests.commands.finetune.test_series import make_run
from tests.conftest import tiny_env
from tests.e2e.runs import entrypoint
from train.commands.finetune.command import FINETUNE_RESULTS

pytestmark = pytest.mark.slow
SAID_ONLY = ("event", "kind", "model")  # a seed's record names what it is; the results file says it by its place


def test_finetune_through_the_front_door(tmp_path: Path) -> None:
    """./entrypoint.sh finetune: the launcher, torchrun, one rank, JSON lines on stdout and the results file."""
    model, task = build_model(tmp_path / "final"), write_task(tmp_path / "task")
    env = tiny_env(tmp_path / "out", task_epochs="1", task_seeds="2", log_format="json")
    started = time.monotonic()
    run = entrypoint("finetune", "--model_name_or_path", str(model), "--task", str(task), env=env, timeout=300)
    took = time.monotonic() - started
    assert run.returncode == 0, run.stderr[-3000:]
    records = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    seeds = [r for r in records if r.get("event") == "finetune_seed"]
    (final,) = [r for r in records if r.get("event") == "finetune"]
    assert [r["seed"] for r in seeds] == [0, 1] and final["written"] == f"{tmp_path / 'out'}/{FINETUNE_RESULTS}"
    results = json.loads((tmp_path / "out" / FINETUNE_RESULTS).read_text())
    assert results["pretrained"]["seeds"] == [{k: v for k, v in r.items() if k not in SAID_ONLY} for r in seeds]
    assert results["world_size"] == 1 and "baseline" not in results
    print(f"finetune through the front door: {took:.1f} s, accuracy {results['pretrained']['mean']['accuracy']:.3f}")


def test_finetune_over_a_runs_checkpoints_through_the_front_door(tmp_path: Path) -> None:
    """--task_all_checkpoints true: a record per seed of each model, in the run's order, and the series written into
    the run's directory, where its report now draws it."""
    files, task = make_run(tmp_path / "run", "scratch:distilbert"), write_task(tmp_path / "task")
    env = tiny_env(tmp_path / "out", task_epochs="1", task_seeds="1", log_format="json")
    args = ["--model_name_or_path", str(files.root), "--output_dir", str(files.root), "--task", str(task)]
    run = entrypoint("finetune", *args, "--task_all_checkpoints", "true", env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    records = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    seeds = [r for r in records if r.get("event") == "finetune_seed"]
    assert [Path(r["model"]).name for r in seeds] == ["checkpoint-2", "checkpoint-4", "checkpoint-6", "final"]
    results = json.loads(files.finetune_results.read_text())
    assert [p["step"] for p in results["series"]] == [2, 4, 6, 6] and "starting" not in results
    assert [p["seeds"][0] for p in results["series"]] == [
        {k: v for k, v in r.items() if k not in SAID_ONLY} for r in seeds
    ]
    assert "downstream-tokens" in files.report.read_text()
