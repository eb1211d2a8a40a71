"""The README is the spec of the front door: its quickstart sequence, run as written on a copy of the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

INTRO = "`./entrypoint.sh` is the same front door the image uses:"


def quickstart_commands() -> list[str]:
    """The indented command block after the quickstart's introduction, comments removed."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").split(INTRO, 1)[1].splitlines()
    block = []
    for line in lines[1:]:
        if not line.strip():
            if block:
                break
            continue
        if not line.startswith("    "):
            break
        block.append(line.split("  #", 1)[0].strip())
    return block


def test_the_readme_sequence_works_as_written(tmp_path: Path) -> None:
    commands = quickstart_commands()
    assert len(commands) >= 3 and commands[0].startswith("./entrypoint.sh plan"), commands
    clone = tmp_path / "clone"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    for name in tracked.splitlines():
        if (REPO / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    (clone / ".venv").symlink_to(REPO / ".venv")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLM_")}
    env["MLM_DEMO_SAMPLES"] = "400"  # the demo's shape, fewer samples: the sequence is what is tested
    # What `make demo` leaves behind: the demo trained into ./output.
    demo = subprocess.run(
        ["bash", "-c", "MLM_CONFIG=configs/demo.yaml ./entrypoint.sh"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert (clone / "output" / "final").is_dir()
    for command in commands:
        result = subprocess.run(["bash", "-c", command], cwd=clone, env=env, capture_output=True, text=True)
        assert result.returncode == 0, f"{command}: exit {result.returncode}\n{result.stderr[-3000:]}"
