"""A NaN or a spike rolls back and goes on (train/run/rollback.py), rehearsed by fault drills (train/run/drills.py):
the job's main() in this process (tests/e2e/conftest.py job_in_process), a tiny model on CPU."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from tests.conftest import run_torchrun, tiny_env

pytestmark = pytest.mark.slow


def test_a_nan_and_a_spike_each_roll_back_skip_their_window_and_the_run_finishes(
    tmp_path: Path, job_in_process: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tiny run's training split is 5 steps an epoch in batches of 64: 20 steps in 4 epochs, a log at every
    step, a checkpoint every 2 (two kept), spike_lr_factor 0.5. nan@5 is seen at step 5 (its gradient norm: logging_nan_inf_filter
    hides the loss), the last healthy log is step 4's, so back to checkpoint-2, the batches of steps 3-5 left out;
    spike@14 (step 14's update times 10,000) shows in step 15's loss: back to checkpoint-12, steps 13-15 left out.
    The skipped steps count as taken (a step's number stays its batches' place in the data): the run ends at step
    20 all the same, and the steps trained again after each rollback are those after its window."""
    output = tmp_path / "out"
    env = tiny_env(
        output, inject_fault="nan@5,spike@14", num_train_epochs="4", logging_steps="1", save_strategy="steps",
        save_steps="2", spike_lr_factor="0.5",
    )  # fmt: skip
    assert job_in_process(env) == 0
    err = capsys.readouterr().err
    run = json.loads((output / "run.json").read_text())
    assert run["status"] == "finished"
    assert run["fault_drill"] == {"faults": ["nan@5", "spike@14"], "fired": ["nan@5", "spike@14"]}
    nan, spike = run["rollbacks"]["rollbacks"]
    assert (nan["detected_at_step"], nan["detected"], nan["rolled_back_to"]) == (5, "non-finite", "checkpoint-2")
    assert (nan["skipped_steps"], nan["batches_skipped_per_rank"]) == ([3, 5], 3)
    assert (spike["detected_at_step"], spike["detected"], spike["rolled_back_to"]) == (15, "spike", "checkpoint-12")
    assert (spike["skipped_steps"], spike["batches_skipped_per_rank"]) == ([13, 15], 3)
    assert spike["what"].startswith("loss ")
    assert "rollback 1 of at most 3" in err and "rollback 2 of at most 3" in err
    assert "after 2 rollbacks (run.json: rollbacks)" in err
    card = (output / "final" / "README.md").read_text()  # the model card says so too, as the report and trackers do
    assert (
        "| rollbacks | step 5 (" in card
        and "back to checkpoint-12, steps 13-15 skipped, peak learning rate x0.5 |" in card
    )
    # The checkpoints after each rollback's point, moved aside (kept for a look), not resumed by a later start.
    assert sorted(p.name.split("-")[2] for p in output.glob(".invalid-checkpoint-*")) == ["14", "4"]
    weights = load_file(output / "final" / "model.safetensors")
    assert all(bool(t.isfinite().all()) for t in weights.values())
    records = [json.loads(line) for line in (output / "logs" / "train.jsonl").read_text().splitlines()]
    logged = [r for r in records if "grad_norm" in r and "loss" in r]
    # Each start of the Trainer says where it starts: the run's, then each rollback's checkpoint; the steps after
    # each window follow the window, so that every step from 1 to 20 is logged once.
    assert [r["start_step"] for r in records if r["event"] == "banner"] == [0, 2, 12]
    assert [r["step"] for r in logged] == list(range(1, 21))
    # The learning rate follows the steps, skipped ones included (in its warm-up: 5e-4 over 50 steps, a step s
    # trains at (s - 1) x 1e-5), times spike_lr_factor 0.5 after the first rollback and 0.25 after the second (it
    # went back to checkpoint-12, saved with the first one's scaled schedule).
    factor = {s: 1.0 if s <= 5 else 0.5 if s <= 15 else 0.25 for s in range(1, 21)}
    assert [r["learning_rate"] for r in logged] == pytest.approx([(s - 1) * 1e-5 * factor[s] for s in range(1, 21)])
    assert (nan["learning_rate_factor"], spike["learning_rate_factor"]) == (0.5, 0.5)
    assert math.isfinite(json.loads((output / "all_results.json").read_text())["eval_loss"])


def test_a_nan_on_one_of_two_gloo_ranks_rolls_both_back_at_the_same_step(tmp_path: Path) -> None:
    """nan@5:1 fires on world rank 1 alone; DDP's reduction carries its NaN gradients to rank 0, and the guard's
    agreed verdict stops both at step 5: both go back to checkpoint-2 and skip 3 batches each (a rank that did not
    would leave the other waiting in a collective: ddp_timeout 60 s ends such a run, not exit 0). 320 samples in
    batches of 16 on 2 ranks: 10 steps."""
    output = tmp_path / "out"
    env = tiny_env(
        output, inject_fault="nan@5:1", per_device_train_batch_size="16", logging_steps="1",
        save_strategy="steps", save_steps="2", ddp_timeout="60",
    )  # fmt: skip
    result = run_torchrun(env, 2)
    assert result.returncode == 0, result.stderr[-3000:]
    run = json.loads((output / "run.json").read_text())
    assert run["status"] == "finished" and run["world_size"] == 2
    [rollback] = run["rollbacks"]["rollbacks"]
    assert (rollback["detected_at_step"], rollback["rolled_back_to"], rollback["skipped_steps"]) == (
        5, "checkpoint-2", [3, 5]
    )  # fmt: skip
    assert rollback["batches_skipped_per_rank"] == 3 and rollback["what"] == "grad_norm is nan"
    records = [json.loads(line) for line in (output / "logs" / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "grad_norm" in r and "loss" in r] == list(range(1, 11))
    weights = load_file(output / "final" / "model.safetensors")
    assert all(bool(t.isfinite().all()) for t in weights.values())


def test_one_past_the_bound_ends_exit_2_in_one_line_saying_what_was_tried(
    tmp_path: Path, job_in_process: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Four NaNs, three rollbacks by default: the fourth ends the run as a divergence does, no final/."""
    output = tmp_path / "out"
    env = tiny_env(
        output, inject_fault="nan@3,nan@6,nan@9,nan@12", num_train_epochs="4", logging_steps="1",
        save_strategy="steps", save_steps="1",
    )  # fmt: skip
    assert job_in_process(env) == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if "training diverged" in line]
    # A save at every step: the weights' check before it sees the NaN update first (then the log would).
    assert line.startswith("mlm-trainer: error: training diverged at step 12 (the weights are not finite); after 3 ")
    assert "(step 3 to checkpoint-1, step 6 to checkpoint-4, step 9 to checkpoint-7)" in line
    assert "the most spike_rollbacks allows: final/ was not written" in line
    run = json.loads((output / "run.json").read_text())
    assert run["status"] == "diverged" and run["rollbacks"]["made"] == 3 and not (output / "final").exists()
