"""Shared fixtures: a clean MLM_* environment, a per-session HF cache, and the tiny demo job's environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The caller's shell must not change what the tests see: HF_HUB_OFFLINE=1 (which the README tells offline users to
# set) or a stray MLM_* option would reach every run the tests start, and huggingface_hub reads its variables once,
# when it is first imported - so they go here, before any test module imports it. Tests set what they need.
CALLER_PREFIXES = ("MLM_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "WANDB_", "MLFLOW_", "PET_", "SLURM_")
for _name in [name for name in os.environ if name.startswith(CALLER_PREFIXES)]:
    del os.environ[_name]


@pytest.fixture(autouse=True)
def _no_user_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests pass their options explicitly; stray MLM_* variables from the caller's shell must not leak in."""
    for name in list(os.environ):
        if name.startswith("MLM_") or name in ("HF_TOKEN", "HF_TOKEN_FILE"):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One HF cache for the session (trained tokenizers and tokenized data are reused across tests)."""
    return tmp_path_factory.mktemp("hf-home")


@pytest.fixture(autouse=True)
def _offline_cache(monkeypatch: pytest.MonkeyPatch, hf_home: Path) -> None:
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub is unreachable here; fail fast instead of retrying
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def tiny_env(output_dir: Path, **options: str) -> dict[str, str]:
    """The environment of a tiny demo run: a 2-layer DistilBERT from scratch on 400 demo samples, one epoch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLM_")}
    env.update(
        MLM_CONFIG=str(REPO / "configs" / "demo.yaml"),
        MLM_DEMO_SAMPLES="400",
        MLM_NUM_TRAIN_EPOCHS="1",
        MLM_DATALOADER_NUM_WORKERS="0",
        MLM_OUTPUT_DIR=str(output_dir),
        PYTHONPATH=str(REPO),
    )
    env.update({f"MLM_{k.upper()}": v for k, v in options.items()})
    return env


def run_torchrun(env: dict[str, str], nproc: int = 1, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """The per-rank job under a real torchrun (gloo on CPU), as the launcher would start it."""
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", f"--nproc-per-node={nproc}", "-m", "train.run.job"]
    # As the launcher decides on CPU: gloo, and --use_cpu so that CPU ranks really form DDP (without it each
    # rank trains its own copy).
    command += ["--ddp_backend", "gloo", "--use_cpu", "true"]
    return subprocess.run(
        [*command, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory):
    """One S3-compatible server (moto) on loopback for the session; its endpoint URL."""
    from tests.servers import s3_server

    with s3_server(tmp_path_factory.mktemp("s3") / "moto.log") as url:
        yield url
