"""A time budget end to end (MLM_TIME_BUDGET), on two ranks through ./entrypoint.sh: the steps planned after a
few are timed, the run stopped (SIGTERM after a checkpoint) and launched again with the same budget, which resumes,
re-plans from the time it has, and ends inside it with final/ written, evaluated, and the learning rate decayed to
zero with the last step (the modern recipe's warmup-stable-decay). The Slurm job's end time as a budget: tests/e2e/test_slurm.py."""

from __future__ import annotations

import json
import math
import re
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import tiny_env
from tests.e2e.runs import records, start, wait_for

pytestmark = pytest.mark.slow

BUDGET_S = 40
# Far more steps than fit: 500 epochs of 320 samples in batches of 8 x 2 ranks, evaluated and saved every 10.
OPTIONS = {
    "time_budget": f"{BUDGET_S}s", "nproc_per_node": "2", "num_train_epochs": "500", "per_device_train_batch_size": "8",
    "eval_strategy": "steps", "eval_steps": "10", "save_strategy": "steps", "save_steps": "10", "logging_steps": "1",
    "warmup_steps": "5",
}  # fmt: skip


def test_a_budgeted_run_stopped_and_resumed_replans_and_ends_inside_its_budget_decayed(tmp_path: Path) -> None:
    output = tmp_path / "out"
    env = tiny_env(output, **OPTIONS)
    first = start(env=env)
    wait_for(output / "checkpoint-10" / ".complete", first)
    first.send_signal(signal.SIGTERM)
    _, stderr = first.communicate(timeout=60)
    assert first.returncode == 75, stderr[-3000:]
    assert f"time budget {BUDGET_S}s (MLM_TIME_BUDGET={BUDGET_S}s): the run ends by" in stderr
    plans = [line for line in stderr.splitlines() if "time budget: planned" in line or "re-planned" in line]
    assert "planned at step 5:" in plans[0] and "set by the time budget" in plans[0], plans
    # the last plan (after an evaluation and a save were timed) is what the checkpoint of the stop holds
    earlier = int(re.findall(r"planned at step \d+: (\d+) steps", plans[-1])[0])
    assert 10 < earlier < 20_000, plans

    launched = time.monotonic()
    second = start(env=env)
    _, stderr = second.communicate(timeout=BUDGET_S + 60)
    took = time.monotonic() - launched
    assert second.returncode == 0, stderr[-3000:]
    assert took < BUDGET_S, f"the run took {took:.1f} s of its {BUDGET_S} s budget"
    run = json.loads((output / "run.json").read_text())
    budget = run["time_budget"]
    assert budget["steps_set_by_options"] == earlier  # the stopped run's plan is where the resumed one starts
    assert 10 < budget["planned_steps"] <= earlier and budget["plans"][0]["at_step"] > 10
    steps = [r for r in records(output / "logs" / "train.jsonl") if r.get("event") == "train" and "loss" in r]
    last = steps[-1]
    # The demo's scratch model gets the modern recipe: warmup-stable-decay, a 1-sqrt decay over the last 20 % of
    # the planned steps. The last step's rate is that decay's last before zero: the schedule ends at the plan.
    assert run["config"]["lr_scheduler_type"] == "warmup_stable_decay" and run["config"]["decay_ratio"] == 0.2
    total = budget["planned_steps"]
    decay = math.ceil(0.2 * total)
    assert last["step"] == total, last
    expected = run["config"]["learning_rate"] * (1 - math.sqrt((decay - 1) / decay))
    assert last["learning_rate"] == pytest.approx(expected), last
    assert json.loads((output / "all_results.json").read_text())["eval_loss"] > 0
    # quality against time: each evaluation of this session, the last one the final model's, inside the budget
    final = run["quality_curve"][-1]
    assert final["step"] == total and final["since_launch_s"] < BUDGET_S and final["tokens_seen"] > 0, final
    assert (output / "final" / "model.safetensors").exists()
