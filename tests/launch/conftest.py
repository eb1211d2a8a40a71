"""Fixtures of the launcher's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes import no_nvml  # noqa: F401 - a fixture, used by name


@pytest.fixture
def base_env(tmp_path: Path) -> dict[str, str]:
    # log_format fixed: `auto` would be resolved on pytest's captured stdout and add a flag to every command.
    return {"MLM_OUTPUT_DIR": str(tmp_path / "out"), "MLM_LOG_FORMAT": "text"}
