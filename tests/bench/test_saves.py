"""bench/saves.py's figures and report from the runs' records (no run here)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.saves import markdown, summary


def run(mode: str, wall: float, blocking: float, background: float, sha: str = "aa") -> dict[str, Any]:
    saves = [
        {"step": s, "mib": 1254.0, "save_blocking_s": blocking + s / 1000, "save_background_s": background}
        for s in (10, 20, 30)
    ]
    return {"mode": mode, "wall_s": wall, "saves": saves, "losses": {1: 10.5, 2: 10.1}, "final_sha256": sha}


RUNS = [
    run("sync", 44.0, 3.4, 0.0),
    run("async", 40.0, 0.1, 3.7),
    run("sync", 42.0, 3.5, 0.0),
    run("async", 41.0, 0.1, 3.7),
]


def test_the_summary_compares_the_loops_wait_and_the_wall_time() -> None:
    figures = summary(RUNS)
    assert figures["sync"]["blocking_s"] == pytest.approx(3.47) and figures["async"]["background_s"] == 3.7
    assert figures["blocking_share"] == pytest.approx(0.12 / 3.47)
    assert figures["wall_ratio"] == pytest.approx(40.5 / 43.0)
    assert figures["same_losses"] and figures["same_weights"]
    other = [*RUNS[:3], run("async", 41.0, 0.1, 3.7, sha="bb")]
    assert not summary(other)["same_weights"]


def test_the_report_has_a_row_per_run_and_the_figures() -> None:
    document = {
        "date": "2026-12-07", "machine": "2 CPUs", "note": "Shared with other work.", "command": "python -m bench.saves",
        "save_steps": 10, "runs": RUNS, "summary": summary(RUNS),
    }  # fmt: skip
    text = markdown(document)
    assert "| 2 | async | 40.0 s | 0.11, 0.12, 0.13 s | 3.70, 3.70, 3.70 s |" in text
    assert "a synchronous save held the loop 3.47 s; a background one 0.12 s (3% of it)" in text
    assert "(0.94x)" in text and "identical in all 4 runs" in text and "Shared with other work." in text
