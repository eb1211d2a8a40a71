"""train.report.runlog: the logs read back as this run's series (resumes, restarts, a cut-off last line), the
Trainer's trainer_state.json for runs without train.jsonl, and no logs at all."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.report.helpers import train_record, write_jsonl
from train.common.errors import ConfigError
from train.outputs.runfiles import TRAINER_STATE, RunFiles
from train.report.plots import loss_figure
from train.report.runlog import load_run, number, status_of


def test_partial_log_of_an_interrupted_resumed_run(tmp_path: Path):
    banner = {"event": "banner", "start_step": 0, "world_size": 8}
    records = [
        banner,
        *[train_record(s, 5.0 - s / 20) for s in (10, 20, 30, 40)],
        {"event": "eval", "step": 20, "epoch": 0.2, "eval_loss": 4.2},
        {"event": "checkpoint", "step": 20, "save_blocking_s": 0.1, "save_background_s": 3.0},
        {"event": "eval", "step": 40, "epoch": 0.4, "eval_loss": 4.0},
        {"event": "checkpoint", "step": 40, "save_blocking_s": 0.1, "save_background_s": 3.0},
        {"event": "train_end", "step": 40, "train_runtime": 12.0},
        {**banner, "start_step": 20},  # preempted after step 40, resumed from checkpoint-20
        train_record(30, 3.0),  # the replayed step: the newer line wins
        {"event": "checkpoint", "step": 30, "save_blocking_s": 3.0, "save_background_s": 0.0},
        train_record(50, "nan"),  # a diverged loss, as the log writes it
    ]
    write_jsonl(RunFiles(tmp_path).train_jsonl, records, tail='{"event": "train", "step": 6')  # cut-off line
    log = load_run(tmp_path)
    # step 40 and its evaluation belong to the attempt that was cut off after checkpoint-20: not this model's past
    assert [r["step"] for r in log.train] == [10, 20, 30, 50] and [r["step"] for r in log.evals] == [20]
    assert log.train[2]["loss"] == 3.0 and log.resumed_at == [20]
    assert [r["step"] for r in log.saves] == [20, 30]  # each save's record, the cut-off attempt's left out
    assert log.summary == {}, "the cut-off attempt's end is not this run's"
    assert len(log.banners) == 2 and log.source == str(RunFiles(tmp_path).train_jsonl)
    assert log.run is None and status_of(log) == "interrupted or still running (no run.json)"


def test_a_start_from_step_0_is_a_new_run(tmp_path: Path):
    """A run started over (or restarted before its first checkpoint) appends to the same train.jsonl: the log is
    the new run's only, which did not resume."""
    first = [{"event": "banner", "start_step": 0}, train_record(10, 4.0), train_record(20, 3.0)]
    first += [{"event": "banner", "start_step": 10}, train_record(20, 3.1), {"event": "train_end", "step": 20}]
    again = [{"event": "banner", "start_step": 0}, train_record(10, 4.5)]
    write_jsonl(RunFiles(tmp_path).train_jsonl, first + again)
    log = load_run(tmp_path)
    assert [r["loss"] for r in log.train] == [4.5] and log.resumed_at == [] and log.summary == {}
    assert len(log.banners) == 1


def test_a_second_resume_forgets_the_first_one_it_went_back_past(tmp_path: Path):
    records = [{"event": "banner", "start_step": 0}, *[train_record(s, 3.0) for s in (10, 20, 30)]]
    records += [{"event": "banner", "start_step": 30}, train_record(40, 2.0)]
    records += [{"event": "banner", "start_step": 20}, train_record(30, 2.5)]  # checkpoint-30 was unusable
    write_jsonl(RunFiles(tmp_path).train_jsonl, records)
    log = load_run(tmp_path)
    assert log.resumed_at == [20] and [r["step"] for r in log.train] == [10, 20, 30]


def test_run_json_and_all_results_are_read_from_their_runfiles_names(tmp_path: Path):
    files = RunFiles(tmp_path)
    write_jsonl(files.train_jsonl, [train_record(1, 2.0)])
    files.run_json.write_text(json.dumps({"status": "finished", "config": {"seed": 1}}))
    files.all_results.write_text("[1, 2]")  # not an object: ignored rather than trusted
    log = load_run(str(tmp_path))  # a str is accepted too
    assert log.output_dir == tmp_path and status_of(log) == "finished"
    assert log.run == {"status": "finished", "config": {"seed": 1}} and log.results is None


def trainer_state(directory: Path, history: list[dict]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / TRAINER_STATE).write_text(json.dumps({"log_history": history}))


HISTORY = [
    {"loss": 3.0, "learning_rate": 1e-4, "grad_norm": 2.0, "epoch": 0.5, "step": 5},
    {"eval_loss": 2.9, "epoch": 1.0, "step": 10},
    {"loss": 2.5, "learning_rate": 5e-5, "grad_norm": 1.0, "epoch": 1.0, "step": 10},
    {"train_runtime": 4.0, "step": 10},
]


def test_falls_back_to_the_newest_checkpoint_trainer_state(tmp_path: Path):
    files = RunFiles(tmp_path)
    trainer_state(files.checkpoint(5), HISTORY[:1])
    trainer_state(files.checkpoint(10), HISTORY)
    trainer_state(files.checkpoint(100), [])  # the newest, but saved before any log step
    trainer_state(tmp_path / "checkpoint-old", HISTORY[:1])  # not a checkpoint's name: never read
    log = load_run(tmp_path)
    assert [r["step"] for r in log.train] == [5, 10] and log.evals[0]["eval_loss"] == 2.9
    assert log.summary["train_runtime"] == 4.0
    assert log.source == str(files.checkpoint(10) / TRAINER_STATE)  # the file actually read


def test_output_dir_trainer_state_comes_before_the_checkpoints(tmp_path: Path):
    trainer_state(tmp_path, HISTORY)
    trainer_state(RunFiles(tmp_path).checkpoint(5), HISTORY[:1])
    log = load_run(tmp_path)
    assert [r["step"] for r in log.train] == [5, 10] and log.source == str(tmp_path / TRAINER_STATE)


def test_a_jsonl_without_steps_falls_back_and_keeps_its_banner(tmp_path: Path):
    files = RunFiles(tmp_path)
    write_jsonl(files.train_jsonl, [{"event": "banner", "start_step": 0, "world_size": 2}])
    trainer_state(files.checkpoint(5), HISTORY[:1])
    log = load_run(tmp_path)
    assert log.banners[0]["world_size"] == 2 and [r["step"] for r in log.train] == [5]


@pytest.mark.parametrize("state", ["[1, 2]", '{"log_history": {"loss": 1}}', "{not json"])
def test_a_trainer_state_that_is_not_a_history_is_no_log(tmp_path: Path, state: str):
    checkpoint = RunFiles(tmp_path).checkpoint(5)
    checkpoint.mkdir()
    (checkpoint / TRAINER_STATE).write_text(state)
    with pytest.raises(ConfigError, match=r"no training logs \(logs/train.jsonl or a checkpoint's trainer_state"):
        load_run(tmp_path)


def test_no_logs_and_no_directory_are_config_errors(tmp_path: Path):
    with pytest.raises(ConfigError, match="no training logs"):
        load_run(tmp_path)
    write_jsonl(RunFiles(tmp_path).train_jsonl, [{"event": "banner", "start_step": 0}])  # started, never logged
    with pytest.raises(ConfigError, match="reached its first log step"):
        load_run(tmp_path)
    with pytest.raises(ConfigError, match="no such directory"):
        load_run(tmp_path / "missing")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(2, 2.0), (0.5, 0.5), ("nan", math.nan), ("inf", math.inf), ("3e-4", 3e-4), (True, None), ("x", None), ({}, None)],
)
def test_number_reads_what_the_log_writes(value: object, expected: float | None):
    got = number(value)
    assert got is expected if expected is None else got == pytest.approx(expected, nan_ok=True)


def test_a_phases_start_is_marked_as_its_phase_and_a_resume_inside_it_as_a_resume(tmp_path: Path):
    def phase(index: int, start: int) -> dict:
        return {"index": index, "count": 2, "name": ["short", "long"][index], "start": start, "end": start + 20}

    records = [{"event": "banner", "start_step": 0, "phase": phase(0, 0)}, train_record(20, 3.0)]
    records += [{"event": "banner", "start_step": 20, "phase": phase(1, 20)}, train_record(30, 2.0)]
    records += [{"event": "banner", "start_step": 30, "phase": phase(1, 20)}, train_record(40, 1.5)]  # stopped
    write_jsonl(RunFiles(tmp_path).train_jsonl, records)
    log = load_run(tmp_path)
    assert log.phase_starts == [(20, "long")] and log.resumed_at == [30]
    figure = loss_figure(log)
    drawn = {line.get_gid() for line in figure.axes[0].lines}
    assert {"phase-20", "resumed-30"} <= drawn and "phase long" in figure.axes[0].get_legend_handles_labels()[1]
