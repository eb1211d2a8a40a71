"""Preemption and crashes through the real front door (./entrypoint.sh -> launcher -> torchrun -> ranks)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, tiny_env

pytestmark = pytest.mark.slow

# 1,600 demo samples in batches of 16: 80 steps, a checkpoint every 10, no dataloader workers.
RESUMABLE = {"demo_samples": "1600", "per_device_train_batch_size": "16", "save_strategy": "steps", "save_steps": "10"}


def start(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [str(REPO / "entrypoint.sh")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, f"exited {process.returncode} before {path} appeared: {process.stderr.read()}"
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout} s"
        time.sleep(0.2)


def rank_pids(launcher_pid: int) -> list[int]:
    """The train.job processes below the launcher (torchrun's workers)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        is_rank = b"train.job" in cmdline and not any(b"torchrun" in part for part in cmdline[:2])
        if is_rank and is_descendant(int(proc.name), launcher_pid):
            found.append(int(proc.name))
    return found


def is_descendant(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def test_sigterm_saves_resumes_and_ends_with_identical_weights(tmp_path: Path) -> None:
    straight = subprocess.run(
        [str(REPO / "entrypoint.sh")], env=tiny_env(tmp_path / "a", **RESUMABLE), capture_output=True, text=True
    )
    assert straight.returncode == 0, straight.stderr[-3000:]

    output = tmp_path / "b"
    env = tiny_env(output, **RESUMABLE)
    process = start(env)
    wait_for(output / "checkpoint-20" / ".complete", process)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 75, stderr[-3000:]
    assert time.monotonic() - sent < 30  # well inside a 30 s grace period
    saved = [p for p in output.glob("checkpoint-*") if (p / ".complete").exists()]
    assert max(int(p.name.split("-")[1]) for p in saved) >= 20
    assert not (output / "final").exists()

    resumed = subprocess.run([str(REPO / "entrypoint.sh")], env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr
    first = (tmp_path / "a" / "final" / "model.safetensors").read_bytes()
    assert (output / "final" / "model.safetensors").read_bytes() == first


def test_a_killed_rank_ends_the_job_without_hanging(tmp_path: Path) -> None:
    output = tmp_path / "out"
    process = start(tiny_env(output, nproc_per_node="2", **RESUMABLE))
    wait_for(output / "checkpoint-10" / ".complete", process)
    victims = rank_pids(process.pid)
    assert len(victims) == 2, victims
    os.kill(victims[1], signal.SIGKILL)
    killed = time.monotonic()
    process.communicate(timeout=180)
    assert process.returncode not in (0, 2, 3, 75)
    assert time.monotonic() - killed < 180
    assert not (output / "final").exists()


def test_max_restarts_resume_from_the_last_checkpoint(tmp_path: Path) -> None:
    output = tmp_path / "out"
    process = start(tiny_env(output, max_restarts="1", **RESUMABLE))
    wait_for(output / "checkpoint-20" / ".complete", process)
    victims = rank_pids(process.pid)
    assert victims
    os.kill(victims[0], signal.SIGKILL)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    assert "resuming from" in stderr
    assert (output / "final" / "model.safetensors").exists()


def test_token_never_leaks_into_logs_or_outputs(tmp_path: Path) -> None:
    canary = "hf_canary_secret_0123456789"
    token_file = tmp_path / "token"
    token_file.write_text(canary)
    output = tmp_path / "out"
    env = tiny_env(output)
    env["HF_TOKEN_FILE"] = str(token_file)
    result = subprocess.run([str(REPO / "entrypoint.sh")], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert canary not in result.stdout + result.stderr
    for path in output.rglob("*"):
        if path.is_file():
            assert canary.encode() not in path.read_bytes(), path
