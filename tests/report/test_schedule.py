"""train.report.schedule: the learning-rate schedule rebuilt from run.json by transformers, checked against schedules
written out here independently of it, and refused (with the reason) whenever the log does not confirm it."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.report.helpers import cosine_warmup, linear_warmup, run_json, train_record, write_jsonl
from train.outputs.runfiles import RunFiles
from train.report import schedule as schedule_module
from train.report.runlog import load_run
from train.report.schedule import lr_schedule, warmup_steps


def logged_run(tmp_path: Path, rate: Callable[[int], float], steps: range, run: dict | None) -> None:
    files = RunFiles(tmp_path)
    write_jsonl(files.train_jsonl, [{**train_record(s, 3.0), "learning_rate": rate(s)} for s in steps])
    if run is not None:
        files.run_json.write_text(json.dumps(run))


@pytest.mark.parametrize(
    ("scheduler", "expected"),
    [
        ("linear", lambda s: linear_warmup(s, 1e-3, 10, 100)),
        ("cosine", lambda s: cosine_warmup(s, 1e-3, 10, 100)),
        ("linear-transformers-4", lambda s: linear_warmup(s, 1e-3, 10, 100, offset=0)),
    ],
)
def test_warmup_is_rebuilt_from_run_json_when_the_log_agrees(tmp_path: Path, scheduler: str, expected):
    """Logged every 20 steps, the 10 warmup steps leave no trace in the log; run.json's schedule shows them."""
    logged_run(tmp_path, expected, range(20, 101, 20), run_json(lr_scheduler_type=scheduler.split("-")[0]))
    schedule, caption = lr_schedule(load_run(tmp_path))
    assert schedule is not None, caption
    assert schedule.warmup_steps == 10 and schedule.max_steps == 100
    rate = dict(zip(schedule.steps, schedule.rates, strict=True))
    ramp = [rate[s] for s in range(1, 11)]
    assert ramp[0] <= 1e-4 and all(a < b for a, b in zip(ramp, ramp[1:], strict=False)), ramp  # the warmup ramp
    assert max(schedule.rates) == pytest.approx(1e-3) and rate[100] < 1e-4
    for step in (1, 5, 11, 20, 55, 100):
        assert rate[step] == pytest.approx(expected(step), abs=1e-12), step
    assert "agrees with all 5 logged learning rates" in caption


@pytest.mark.parametrize(
    ("run", "reason"),
    [
        (None, "no run.json"),
        (run_json(learning_rate=2e-3), "gives 0.0018 at step 20, the log 0.0009"),  # the options disagree with the log
        (run_json(lr_scheduler_type="reduce_lr_on_plateau"), "cannot compute 'reduce_lr_on_plateau'"),
        (run_json(lr_scheduler_type="no-such-schedule"), "cannot compute 'no-such-schedule'"),
        (run_json(lr_scheduler_kwargs="{not json"), "lr_scheduler_kwargs is not a dictionary"),
        (run_json(lr_scheduler_kwargs=[1]), "lr_scheduler_kwargs is not a dictionary"),
        (run_json(lr_scheduler_type=None), "lack learning_rate, lr_scheduler_type or max_steps"),
    ],
)
def test_no_schedule_that_the_log_does_not_confirm(tmp_path: Path, run: dict | None, reason: str):
    logged_run(tmp_path, lambda s: linear_warmup(s, 1e-3, 10, 100), range(20, 41, 20), run)
    schedule, caption = lr_schedule(load_run(tmp_path))
    assert schedule is None and reason in caption, caption


def test_no_logged_rate_to_check_against(tmp_path: Path):
    files = RunFiles(tmp_path)
    write_jsonl(files.train_jsonl, [{**train_record(20, 3.0), "learning_rate": "nan"}])
    files.run_json.write_text(json.dumps(run_json()))
    assert lr_schedule(load_run(tmp_path)) == (None, "Schedule not drawn: no logged learning rate to check it against.")


def test_kwargs_given_as_a_json_string_are_read(tmp_path: Path):
    """run.json keeps lr_scheduler_kwargs as the user wrote it: a JSON string from an env var or a flag."""
    run = run_json(lr_scheduler_type="cosine", lr_scheduler_kwargs='{"num_cycles": 0.5}')
    logged_run(tmp_path, lambda s: cosine_warmup(s, 1e-3, 10, 100), range(20, 101, 20), run)
    schedule, caption = lr_schedule(load_run(tmp_path))
    assert schedule is not None and schedule.kind == "cosine", caption


def test_a_failing_scheduler_is_named_by_its_first_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The caption is one line under the chart: a multi-line error (a transformers traceback-like message) is cut
    to its first line."""

    def broken(*args: Any) -> Callable[[int], float]:
        raise ValueError("\nbad scheduler options\n  File 'x', line 2")

    monkeypatch.setattr(schedule_module, "schedule_factor", broken)
    logged_run(tmp_path, lambda s: linear_warmup(s, 1e-3, 10, 100), range(20, 41, 20), run_json())
    schedule, caption = lr_schedule(load_run(tmp_path))
    assert schedule is None
    assert (
        caption == "Schedule not drawn: transformers cannot compute 'linear' here (ValueError: bad scheduler options)."
    )


def test_a_schedule_that_fails_on_a_step_is_not_drawn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def factor(step: int) -> float:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(schedule_module, "schedule_factor", lambda *args: factor)
    logged_run(tmp_path, lambda s: linear_warmup(s, 1e-3, 10, 100), range(20, 41, 20), run_json())
    schedule, caption = lr_schedule(load_run(tmp_path))
    assert schedule is None and "'linear' failed here (ZeroDivisionError: division by zero)" in caption


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"warmup_steps": 10}, 10),  # a count
        ({"warmup_steps": 0.1}, 10),  # below 1: a fraction of the steps (transformers 5)
        ({"warmup_steps": 0.105}, 11),  # rounded up, as TrainingArguments.get_warmup_steps does
        ({"warmup_steps": 0, "warmup_ratio": 0.05}, 5),  # transformers 4's run.json
        ({"warmup_steps": "nope"}, 0),
        ({}, 0),
    ],
)
def test_warmup_steps(config: dict, expected: int):
    assert warmup_steps(config, 100) == expected


def wsd_1_sqrt(step: int, lr: float, warmup: int, total: int, decay: int) -> float:
    """Warm-up, stable, then a 1-sqrt decay over the last ``decay`` steps; transformers 5 logs step s with the
    rate after s - 1 scheduler steps."""
    k = step - 1
    if k < warmup:
        return lr * k / warmup
    if k < total - decay:
        return lr
    return lr * max(0.0, 1 - math.sqrt((k - (total - decay)) / decay))


def test_warmup_stable_decay_is_drawn_with_the_decay_the_job_computed_from_decay_ratio(tmp_path: Path) -> None:
    """The modern recipe's schedule: run.json has decay_ratio, not num_decay_steps (train/common/schedules.py)."""
    rate_of = lambda s: wsd_1_sqrt(s, 1e-3, 10, 100, 20)  # noqa: E731 - 20 % of 100 steps
    run = run_json(
        lr_scheduler_type="warmup_stable_decay", lr_scheduler_kwargs={"decay_type": "1-sqrt"}, decay_ratio=0.2
    )
    logged_run(tmp_path, rate_of, range(10, 101, 10), run)
    schedule, caption = lr_schedule(load_run(tmp_path))
    assert schedule is not None, caption
    rate = dict(zip(schedule.steps, schedule.rates, strict=True))
    for step in (1, 5, 11, 50, 81, 85, 95, 100):
        assert rate[step] == pytest.approx(rate_of(step)), step
    assert rate[81] == pytest.approx(1e-3) and rate[82] < 1e-3  # stable until the last 20 steps
