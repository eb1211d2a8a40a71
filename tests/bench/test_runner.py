"""bench/runner.py: what every run's environment holds and where the results are written."""

from __future__ import annotations

import json

from bench.runner import child_env, write_results


def test_a_run_gets_the_callers_environment_without_its_job_options(monkeypatch, tmp_path):
    monkeypatch.setenv("MLM_MAX_STEPS", "3")  # would change the recipes
    monkeypatch.setenv("BENCH_KEPT", "yes")
    env = child_env(tmp_path, 1, EXTRA="x")
    assert "MLM_MAX_STEPS" not in env and env["BENCH_KEPT"] == "yes" and env["EXTRA"] == "x"
    assert (env["HF_HOME"], env["HF_HUB_OFFLINE"], env["OMP_NUM_THREADS"]) == (str(tmp_path / "hf"), "1", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert child_env(tmp_path, 0)["OMP_NUM_THREADS"] == "5"  # 0: as the caller (or the launcher) sets it


def test_results_are_the_json_the_report_and_the_latest_unless_tagged(tmp_path):
    write_results(tmp_path / "r", "2026-01-01-h", {"runs": [1]}, "# report\n", "latest.md")
    assert json.loads((tmp_path / "r" / "2026-01-01-h.json").read_text()) == {"runs": [1]}
    assert (tmp_path / "r" / "2026-01-01-h.md").read_text() == (tmp_path / "r" / "latest.md").read_text()
    write_results(tmp_path / "t", "2026-01-01-h-tag", {}, "# tagged\n", None)
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["2026-01-01-h-tag.json", "2026-01-01-h-tag.md"]
