"""The deadline a time budget sets (train/launch/deadline.py) and the durations it reads (train/common/durations.py).
The Slurm end time from a real controller: tests/e2e/test_slurm.py."""

from __future__ import annotations

from datetime import datetime

import pytest

from train.common import durations
from train.common.errors import ConfigError
from train.config import load_config
from train.launch.deadline import parse_slurm_time, run_deadline

STARTED = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90m", 5400), ("2h", 7200), ("1h30m", 5400), ("45s", 45), ("5400", 5400), ("1.5h", 5400), (" 2H ", 7200),
     ("1-00:00:00", 86400), ("01:30:00", 5400), ("10:00", 600), ("1d2h", 93600)],
)  # fmt: skip
def test_durations_read_as_people_and_slurm_write_them(text: str, seconds: float) -> None:
    assert durations.seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5", "2x", "h", "1h-30m", "1:2:3:4", "inf", "nan"])
def test_what_is_no_duration_is_none(text: str) -> None:
    assert durations.seconds(text) is None


def test_a_moment_with_its_zone_is_an_end_time_and_one_without_is_refused() -> None:
    assert durations.until("2027-01-15T10:00:00Z") == STARTED + 7200
    assert durations.until("2027-01-15T11:00:00+01:00") == STARTED + 7200
    for text in ("2027-01-15T10:00:00", "2027-01-15", "5400", "2h", "soon"):
        assert durations.until(text) is None, text


def test_a_budget_that_names_its_end_counts_to_it_however_late_the_launch() -> None:
    # A Kubernetes Job's deadline, computed once at submission: every node and every restart ends by it.
    end = "2027-01-15T10:00:00Z"  # STARTED + 2 h
    deadline = run_deadline(config(end).budget, {}, STARTED + 600, STARTED + 605)  # launched 10 minutes late
    assert deadline is not None
    assert (deadline.at, deadline.budget_s, deadline.source) == (STARTED + 7200, 6600, f"--time_budget={end}")
    with pytest.raises(ConfigError, match=rf"^--time_budget={end}: 0 s are left"):
        run_deadline(config(end).budget, {}, STARTED + 7300, STARTED + 7300)  # restarted after it
    with pytest.raises(ConfigError, match=r"^--time_budget='2027-01-15T10:00:00': expected a duration .* zone"):
        config("2027-01-15T10:00:00")


def test_durations_are_shown_largest_units_first() -> None:
    assert [durations.shown(s) for s in (5400, 95, 42.4, 0, 86400 + 61)] == ["1h30m", "1m35s", "42s", "0s", "1d1m1s"]


def test_a_bad_budget_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLM_TIME_BUDGET", "2 hours")
    with pytest.raises(ConfigError, match=r"^MLM_TIME_BUDGET='2 hours': expected a duration such as 90m"):
        load_config([])


def config(budget: str | None):
    return load_config([] if budget is None else ["--time_budget", budget])


def test_no_budget_no_deadline_even_under_slurm() -> None:
    # A Slurm job's limit never counts unasked: requeued jobs carry one long run on, checkpoint to checkpoint.
    asked = []
    assert run_deadline(config(None).budget, {"SLURM_JOB_ID": "7"}, STARTED, STARTED, asked.append) is None
    assert asked == []


def test_a_budget_counts_from_the_launch() -> None:
    deadline = run_deadline(config("2h").budget, {}, STARTED, STARTED + 5)
    assert deadline is not None
    assert (deadline.at, deadline.budget_s, deadline.source) == (STARTED + 7200, 7200, "--time_budget=2h")


def test_under_slurm_the_earlier_end_counts() -> None:
    end = datetime.fromtimestamp(STARTED + 600).isoformat(timespec="seconds")  # squeue prints local time
    deadline = run_deadline(config("2h").budget, {"SLURM_JOB_ID": "7"}, STARTED, STARTED + 5, lambda job: end + "\n")
    assert deadline is not None
    assert (deadline.at, deadline.source) == (STARTED + 600, "--time_budget=2h: the Slurm job 7's end time")
    later = datetime.fromtimestamp(STARTED + 9000).isoformat(timespec="seconds")
    deadline = run_deadline(config("2h").budget, {"SLURM_JOB_ID": "7"}, STARTED, STARTED + 5, lambda job: later)
    assert deadline is not None and deadline.source == "--time_budget=2h"


def test_slurm_alone_needs_a_job_with_a_limit() -> None:
    with pytest.raises(ConfigError, match=r"--time_budget=slurm: not inside a Slurm job \(SLURM_JOB_ID is unset\)"):
        run_deadline(config("slurm").budget, {}, STARTED, STARTED)
    with pytest.raises(ConfigError, match=r"--time_budget=slurm: the Slurm job 7 has no time limit"):
        run_deadline(config("slurm").budget, {"SLURM_JOB_ID": "7"}, STARTED, STARTED, lambda job: "N/A")
    assert parse_slurm_time("Unknown") is None and parse_slurm_time("") is None


def test_a_budget_too_small_for_one_step_is_exit_2_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match=r"^--time_budget=40s: 25 s are left once the launcher has started") as info:
        run_deadline(config("40s").budget, {}, STARTED, STARTED + 15)
    assert info.value.exit_code == 2
