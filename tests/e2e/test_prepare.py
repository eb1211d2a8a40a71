"""``entrypoint.sh prepare`` tokenizes into the cache the job then reads, without starting any rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import tiny_env
from tests.e2e.runs import entrypoint

pytestmark = pytest.mark.slow


def test_prepare_fills_the_cache_the_job_then_uses(tmp_path: Path) -> None:
    env = {**tiny_env(tmp_path / "out"), "HF_HOME": str(tmp_path / "shared-volume")}
    prepared = entrypoint("prepare", env=env)
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    assert "mlm-trainer: prepared in" in prepared.stderr and "train 320 examples" in prepared.stderr
    assert "Tokenizing train" in prepared.stderr
    assert not (tmp_path / "out").exists()  # nothing trained, nothing written to the output dir
    trained = entrypoint(env=env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "Tokenizing" not in trained.stderr  # every split came from the cache prepare wrote


def test_prepare_refuses_bad_input_like_the_job(tmp_path: Path) -> None:
    env = {**tiny_env(tmp_path / "out", dataset=str(tmp_path / "missing.txt")), "HF_HOME": str(tmp_path / "hf")}
    done = entrypoint("prepare", env=env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("no such file or directory")
