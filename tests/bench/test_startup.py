"""bench/startup.py: the start-up ratios and targets, the log records it reads, and one timed import."""

from __future__ import annotations

import os

import pytest

from bench import report, startup
from bench.runner import ROOT


def test_startup_ratios_are_taken_per_round_and_checked_against_the_targets():
    def rounds(*seconds):
        return [{"import_s": s, "process_s": s + 0.5} for s in seconds]

    imports = {"bare": rounds(3.0, 4.0, 3.0), "trainer": rounds(4.5, 6.0, 4.5), "job": rounds(3.3, 4.4, 3.9),
               "launcher": rounds(1.5, 2.0, 1.5)}  # fmt: skip
    demo = [{"wall_s": 8.0, "first_step_s": 6.0, "steps_s": 1.0}, {"wall_s": 7.5, "first_step_s": 5.5, "steps_s": 0.5}]
    summary = startup.summarise(imports, demo)
    assert summary["imports"]["job"]["ratio_to_bare"]["median"] == pytest.approx(1.1)  # 1.1, 1.1, 1.3
    assert summary["imports"]["job"]["ratio_to_bare"]["max"] == pytest.approx(1.3)
    assert summary["demo"]["overhead_to_bare"]["median"] == pytest.approx(7.0 / 3.0)  # (8 - 1) / median bare 3
    rows = {row["what"]: row for row in summary["targets"]}
    assert rows["import train.run.job / bare import"]["met"] is True
    assert rows["warm 2-step demo run less its steps / bare import"]["met"] is False
    text = "\n".join(report.startup_markdown(summary))
    assert "| `import train.run.job` | 3.90 [3.30 – 4.40] | 4.40 [3.80 – 4.90] | 1.10 [1.10 – 1.30] |" in text
    assert "| warm 2-step demo run less its steps / bare import | 2.33 | ≤ 2.0 | **no** |" in text


def test_the_first_step_is_read_from_the_json_records_alike_cold_and_warm():
    assert startup.log_record('{"event": "train", "step": 1, "loss": 4.3}\n')["event"] == "train"
    for line in ('{"event": "launch"', "mlm-trainer: finished\n", "Tokenizing train:  50%|{bar}\n", "\n"):
        assert startup.log_record(line).get("event") != "train"


def test_a_startup_import_is_timed_inside_a_fresh_process():
    timed = startup.time_import("import json", os.environ, ROOT)
    assert 0 < timed["import_s"] < timed["process_s"]
