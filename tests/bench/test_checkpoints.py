"""bench/checkpoints.py's figures from the job's checkpoint records (no run here)."""

from __future__ import annotations

import pytest

from bench.checkpoints import markdown, summary

SAVES = [
    {"step": 1, "files": 10, "mib": 1254.0, "save_s": 9.0, "digest_s": 3.0},  # the first: a cold cache
    {"step": 2, "files": 10, "mib": 1254.0, "save_s": 3.0, "digest_s": 1.0},
    {"step": 3, "files": 10, "mib": 1254.0, "save_s": 4.0, "digest_s": 1.2},
    {"step": 4, "files": 10, "mib": 1254.0, "save_s": 2.0, "digest_s": 0.9},
]


def test_the_steady_state_leaves_the_first_save_out() -> None:
    figures = summary(SAVES)
    assert (figures["save_s"], figures["digest_s"]) == (3.0, 1.0)
    assert figures["share"] == pytest.approx(0.25) and figures["mib_per_s"] == pytest.approx(1254.0)


def test_the_report_has_a_row_per_save_and_the_resume_checks() -> None:
    document = {
        "date": "2026-12-03",
        "machine": "2 CPUs",
        "command": "python -m bench.checkpoints",
        "job": {"wall_s": 40.0, "saves": SAVES},
        "resume": {"problem_s": [1.3, 1.1], "digests_s": [1.0, 0.95]},
        "summary": summary(SAVES),
    }
    text = markdown(document)
    assert "| 2 | 1,254 MiB, 10 files | 3.00 s | 1.00 s | 25% |" in text
    assert "1.10 s in all, 0.95 s of it the digests" in text
