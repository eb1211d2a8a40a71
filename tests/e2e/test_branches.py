"""Decay branches from one stable checkpoint, through the front door: a warmup-stable-decay parent, two branches
with different decays started side by side from its checkpoint, their average, and each scored by ``evaluate``.
The branches are real launches; the parent, the average, the score and the launcher's refusal run here, in this
process (a launch is about 15 CPU-seconds of start-up; ``average`` and ``evaluate`` through ./entrypoint.sh:
tests/e2e/test_job.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForMaskedLM

from tests.conftest import tiny_env
from tests.e2e.runs import launcher_here, logged_losses, records, start
from train.commands.average import main as average
from train.commands.evaluate import main as evaluate

pytestmark = pytest.mark.slow

# 32 steps of 16 demo samples (512 of the 640 train), a checkpoint every 10, the learning rate logged every step.
PARENT = {
    "demo_samples": "640",
    "per_device_train_batch_size": "16",
    "save_strategy": "steps",
    "save_steps": "10",
    "save_total_limit": "5",
    "logging_steps": "1",
    "lr_scheduler_type": "warmup_stable_decay",
    "warmup_steps": "2",
    "learning_rate": "1e-3",
}


@pytest.fixture
def parent(tmp_path: Path, job_in_process: Any) -> Path:
    """The parent run (its own decay in its last 20 %): checkpoint-20 is in its stable phase. The job's main() in
    this process: what a branch reads of it is the checkpoint a rank wrote, whoever started the rank."""
    output = tmp_path / "parent"
    assert job_in_process(tiny_env(output, **PARENT)) == 0
    return output


def rates(output: Path) -> dict[int, float]:
    return {r["step"]: r["learning_rate"] for r in records(output / "logs" / "train.jsonl") if "learning_rate" in r}


def test_two_decay_branches_from_one_stable_checkpoint_train_side_by_side_and_average(
    parent: Path, tmp_path: Path, job_in_process: Any, capsys: Any
) -> None:
    point = parent / "checkpoint-20"
    short, long = tmp_path / "short", tmp_path / "long"
    # Branch "short" decays over its 5 steps after the branch point (max_steps 25, decay_ratio 0.2); "long" runs 10
    # more, at half the parent's peak (the restored schedule's peak scales with the branch's learning rate), stable
    # until its last 6 steps.
    branches = {
        short: ("--max_steps", "25", "--decay_ratio", "0.2"),
        long: ("--max_steps", "30", "--decay_ratio", "0.2", "--learning_rate", "5e-4"),
    }
    # "short" is given the parent's options again; "long" only what it changes: the rest (the schedule, the batch,
    # the logging and saving) is its parent's, as its checkpoint recorded them.
    envs = {
        short: tiny_env(short, **{**PARENT, "num_train_epochs": "100"}),
        long: {
            name: value
            for name, value in tiny_env(long, demo_samples=PARENT["demo_samples"], num_train_epochs="100").items()
            if name != "MLM_CONFIG"  # the demo's preset too: the parent's, as recorded
        },
    }
    running = [start("branch", str(point), *flags, env=envs[out]) for out, flags in branches.items()]
    said = {}
    for out, process in zip(branches, running, strict=True):
        _, said[out] = process.communicate(timeout=600)
        assert process.returncode == 0, said[out][-3000:]
        assert f"a branch of {point} at step 20" in said[out]
    taken = re.search(r"the parent's options where the branch sets none: ([a-z0-9_, ]+)", said[long])
    assert taken, said[long][-3000:]
    from_parent = set(taken[1].split(", "))
    assert {"lr_scheduler_type", "warmup_steps", "per_device_train_batch_size", "logging_steps"} <= from_parent
    assert not {"learning_rate", "max_steps", "output_dir", "demo_samples"} & from_parent  # the branch's own
    assert "keeps the checkpoint's values" not in said[long]  # its new learning rate is honoured (below), not kept

    parent_rates = rates(parent)
    for out, last in ((short, 25), (long, 30)):
        run = json.loads((out / "run.json").read_text())
        assert run["branch"]["parent"] == str(point) and run["branch"]["step"] == 20
        losses = logged_losses(out)
        assert min(losses) == 21 and max(losses) == last  # the branch's curve starts at the branch point
        assert rates(out)[last] < 0.15 * max(rates(out).values())  # the last step's rate: decayed
    assert parent_rates[21] == pytest.approx(1e-3)  # the parent was stable there
    assert rates(short)[21] == pytest.approx(1e-3) and rates(short)[22] < 1e-3  # decaying from the branch point on
    assert [rates(long)[step] for step in range(21, 25)] == pytest.approx([5e-4] * 4)  # stable at its own peak

    averaged = tmp_path / "averaged"
    inputs = [str(short / "final"), str(long / "final"), "--output_dir", str(averaged)]
    assert job_in_process(tiny_env(averaged), main=average, args=inputs) == 0
    models = [AutoModelForMaskedLM.from_pretrained(d / "final") for d in (short, long, averaged)]
    for name, mean in models[2].state_dict().items():
        assert torch.allclose(mean, (models[0].state_dict()[name] + models[1].state_dict()[name]) / 2, atol=1e-6)
    scoring = tiny_env(tmp_path / "scored", model_name_or_path=str(averaged / "final"))
    assert job_in_process(scoring, main=evaluate) == 0
    assert "eval_loss" in json.loads((tmp_path / "scored" / "eval_results.json").read_text())

    code, said_again = launcher_here(capsys, tiny_env(short, **PARENT), "branch", str(point), "--max_steps", "25")
    assert code == 2 and "holds a finished model" in said_again, said_again[-2000:]
