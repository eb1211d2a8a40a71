"""bench/mfu.py: a run's records against the MFU case's pass criterion."""

from __future__ import annotations

import json
from pathlib import Path

from bench.mfu import main, medians, verdict


def records(mfu: float, wait: float) -> list[dict]:
    first = {"event": "train", "step": 25, "mfu": 0.01, "data_wait_share": 0.9}  # the loader's start: left out
    steps = [{"event": "train", "step": 50 * i, "mfu": mfu, "data_wait_share": wait} for i in range(1, 4)]
    return [{"event": "banner"}, first, *steps]


def test_the_medians_leave_the_first_record_out_and_judge_mfu_and_data_wait() -> None:
    assert medians(records(0.4, 0.01))["mfu"] == 0.4
    assert verdict(medians(records(0.4, 0.01)))[0]
    assert not verdict(medians(records(0.1, 0.01)))[0]
    assert not verdict(medians(records(0.4, 0.2)))[0]
    passed, line = verdict(medians([{"event": "train"}] * 3))
    assert not passed and "no MFU" in line


def test_it_reads_a_runs_log(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "train.jsonl").write_text("\n".join(json.dumps(r) for r in records(0.3, 0.0)) + "\n")
    assert main([str(tmp_path)]) == 0
