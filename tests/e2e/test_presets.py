"""The presets for the models people start from (configs/), each run at a tiny size: a family's from-scratch
preset trains a model (the job's main() in this process), which then stands in the hub cache (offline, as a mounted
cache would) under the hub id of the family's continued-pretraining preset, which trains on from it through
./entrypoint.sh (a cache of its own: the hub library reads HF_HOME once per process)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, tiny_env
from tests.e2e.runs import entrypoint

pytestmark = pytest.mark.slow

TINY = "num_hidden_layers=1,hidden_size=32,num_attention_heads=2,intermediate_size=64"
SHORT = {"demo_samples": "160", "max_seq_length": "64", "per_device_train_batch_size": "8", "save_strategy": "no"}


def put_in_hub_cache(hf_home: Path, repo_id: str, model: Path) -> None:
    """``model``'s files as huggingface_hub's cache holds a download of ``repo_id`` (refs/main -> a snapshot)."""
    revision = "0" * 40
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(model, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)


@pytest.mark.parametrize("family", ["bert", "roberta", "xlm-roberta", "modernbert"])
def test_a_familys_presets_train_from_scratch_then_on_from_that_model(
    tmp_path: Path, family: str, job_in_process: Any
) -> None:
    scratch = tmp_path / "scratch"
    env = tiny_env(
        scratch, config=str(REPO / "configs" / f"scratch-{family}.yaml"), config_overrides=TINY,
        tokenizer_vocab_size="300", max_steps="3", **SHORT,
    )  # fmt: skip
    assert job_in_process(env) == 0
    assert json.loads((scratch / "final" / "config.json").read_text())["model_type"] == family

    preset = REPO / "configs" / f"{family}-base.yaml"
    repo_id = next(line.split(": ", 1)[1] for line in preset.read_text().splitlines() if line.startswith("model_"))
    put_in_hub_cache(tmp_path / "hf", repo_id, scratch / "final")
    continued = tmp_path / "continued"
    env = tiny_env(continued, config=str(preset), max_steps="2", **SHORT)
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    done = entrypoint(env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads((continued / "run.json").read_text())
    assert run["config"]["model_name_or_path"] == repo_id and run["model"]["head_weights"] is None
    assert (continued / "final" / "model.safetensors").exists()
