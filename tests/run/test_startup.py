"""The start-up's phases (train/run/startup.py): marks that add up, the record, its line."""

from __future__ import annotations

import pytest

from train.run import startup as startup_module
from train.run.logs import _text_line
from train.run.startup import Startup


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


def test_phases_add_up_from_the_launch_and_the_line_says_them(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(103.0)
    monkeypatch.setattr(startup_module, "time", clock)
    startup = Startup(process_at=100.0, launched_at=98.0, last=100.0)
    startup.mark("imports")
    clock.now = 104.0
    startup.mark("tokenizing", "cached")
    clock.now = 104.01
    startup.mark("model")
    clock.now = 104.5
    startup.mark("tokenizing")  # met again: adds up, the note kept
    clock.now = 106.0
    startup.mark("first step")
    record = startup.record()
    assert record["phases_s"] == {
        "launcher": 2.0, "imports": 3.0, "tokenizing": 1.49, "model": 0.01, "first step": 1.5
    }  # fmt: skip
    assert record["to_first_step_s"] == 8.0 and record["from"] == "launch"
    assert record["notes"] == {"tokenizing": "cached"}
    line = _text_line({**record, "time": "2026-12-05T10:00:00+00:00"})
    assert line == (
        "[10:00:00] start-up: the first step ended 8.0 s after launch: launcher 2.0 s, imports 3.0 s, "
        "tokenizing 1.5 s (cached), first step 1.5 s"
    )  # a phase under 0.05 s is left out of the line


def test_without_a_launcher_the_start_up_counts_from_the_process_start() -> None:
    startup = Startup.begin()
    assert startup.phases["imports"] >= 0 and startup.launched_at is None
    startup.mark("first step")
    record = startup.record()
    assert record["from"] == "process start" and "launcher" not in record["phases_s"]
