"""The memory series' settings and its report (the runs themselves are whole
./entrypoint.sh runs: make bench)."""

from __future__ import annotations

import pytest

from bench import memory
from bench.run import memory_settings, parse_args, selected_series

MIB = 2**20


def test_the_series_runs_only_when_asked_and_takes_its_options() -> None:
    assert "memory" not in selected_series(parse_args([]), "cpu")
    settings = memory_settings(parse_args(["--series", "memory", "--memory-sizes", "tiny,base"]), "cpu")
    assert settings.sizes == ["tiny", "base"] and settings.ranks == 2
    with pytest.raises(ValueError, match="unknown memory series size"):
        memory_settings(parse_args(["--memory-sizes", "huge"]), "cpu")


def test_the_report_gives_fsdps_share_of_ddps_per_size() -> None:
    def run(mode: str, state: int, peak: int, setup: list[int]) -> dict:
        return {"size": "tiny", "mode": mode, "parameters": 1000, "state_bytes_per_rank": [state * MIB, state * MIB],
                "peak_bytes_per_rank": [peak * MIB, peak * MIB - 1], "setup_bytes_per_rank": [s * MIB for s in setup]}  # fmt: skip

    result = {
        "date": "2026-12-04", "settings": {"device": "cpu", "ranks": 2, "max_steps": 5, "batch_size": 8,
                                           "sizes": ["tiny", "small"]},
        "runs": [run("ddp", 40, 900, [30, 31]), run("fsdp", 20, 720, [45, 12])], "failures": ["memory small fsdp exited 1"],
    }  # fmt: skip
    text = memory.memory_report(result)
    row = (
        "| tiny | 1,000 | 40.0 MiB | 20.0 MiB | 0.50 | 900.0 MiB | 720.0 MiB | 0.80 | 31.0 MiB | 45.0 MiB / 12.0 MiB |"
    )
    assert row in text
    assert "| small |" not in text and "Failed: memory small fsdp exited 1" in text
