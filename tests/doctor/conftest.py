"""The doctor's environment: the demo's scratch model and data, output and cache in tmp, no cluster variables,
and a roomy /dev/shm (tests of the /dev/shm row set their own)."""

from __future__ import annotations

import os

import pytest

from tests.doctor.helpers import GIB
from train.machine import resources

CLUSTER = ("MASTER_", "PET_", "CUDA_VISIBLE", "NVIDIA_VISIBLE", "SLURM_")
CLUSTER_NAMES = ("NNODES", "NODE_RANK", "GROUP_RANK", "JOB_COMPLETION_INDEX", "WORLD_SIZE", "RANK", "LOCAL_RANK")
HF_NAMES = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE")


@pytest.fixture
def env(tmp_path, monkeypatch) -> dict[str, str]:
    for name in list(os.environ):
        if name.startswith(CLUSTER) or name in CLUSTER_NAMES or name in HF_NAMES:
            monkeypatch.delenv(name, raising=False)
    values = {
        "MLM_MODEL_NAME_OR_PATH": "scratch:distilbert",
        "MLM_DATASET": "demo",
        "MLM_OUTPUT_DIR": str(tmp_path / "out"),
        "MLM_LOG_FORMAT": "text",
        "HF_HOME": str(tmp_path / "hf"),
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(resources, "shm_size", lambda path="/dev/shm": 16 * GIB)
    return values
