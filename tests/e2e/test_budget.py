"""A time budget end to end (MLM_TIME_BUDGET), on two ranks through ./entrypoint.sh: the steps planned after a
few are timed, the run stopped (SIGTERM after a checkpoint) and launched again with the same budget, which resumes,
re-plans from the time it has, and ends inside it with final/ written, evaluated, and the learning rate decayed to
zero with the last step (the modern recipe's warmup-stable-decay); and a stop signal as the deadline come early:
the stop's checkpoint, then the steps that fit the stop's window, decaying, to a stopped run's final/ (or, when the
plan's rest fits, the plan finished), the resumed run on a CPU made busy on purpose. The Slurm job's end time as a
budget: tests/e2e/test_slurm.py."""

from __future__ import annotations

import contextlib
import json
import math
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import tiny_env
from tests.e2e.runs import entrypoint, last_rate, records, start, wait_for
from train.outputs.checkpoints import planned_steps

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # timed or to a deadline: not beside other runs

BUDGET_S = 40
STOP_TIMEOUT_S = 30  # torchrun's time for the ranks after a stop signal
# Far more steps than fit: 500 epochs of 320 samples in batches of 8 x 2 ranks, evaluated and saved every 10.
OPTIONS = {
    "time_budget": f"{BUDGET_S}s", "nproc_per_node": "2", "num_train_epochs": "500", "per_device_train_batch_size": "8",
    "eval_strategy": "steps", "eval_steps": "10", "save_strategy": "steps", "save_steps": "10", "logging_steps": "1",
    "warmup_steps": "5", "mlm_probability": "0.3", "final_mlm_probability": "0.1", "batch_warmup_ratio": "0.5",
}  # fmt: skip


@contextlib.contextmanager
def busy_cpu() -> Iterator[None]:
    """One process spinning on a core for as long as the block runs."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def test_a_budgeted_run_stopped_and_resumed_replans_and_ends_inside_its_budget_decayed(tmp_path: Path) -> None:
    output = tmp_path / "out"
    env = tiny_env(output, **OPTIONS)
    # 10 s to stop leave no step after the stop's checkpoint (the margin alone is 10 s): it exits at once, and the
    # run is resumed. (With the default 270 s the rest of the plan would fit: it would finish, as the next test says.)
    first = start(env={**env, "MLM_STOP_TIMEOUT": "10"})
    wait_for(output / "checkpoint-10" / ".complete", first)
    first.send_signal(signal.SIGTERM)
    _, stderr = first.communicate(timeout=60)
    assert first.returncode == 75, stderr[-3000:]
    assert f"time budget {BUDGET_S}s (MLM_TIME_BUDGET={BUDGET_S}s): the run ends by" in stderr
    plans = [line for line in stderr.splitlines() if "time budget: planned" in line or "re-planned" in line]
    assert "planned at step 5:" in plans[0] and "set by the time budget" in plans[0], plans
    # every plan printed, the checkpoint the rerun resumes holding one of them
    printed = [int(n) for line in plans for n in re.findall(r"planned at step \d+: (\d+) steps", line)]
    assert printed and all(10 < n < 20_000 for n in printed), plans
    newest = max((p for p in output.glob("checkpoint-*") if (p / ".complete").exists()), key=lambda p: int(p.name[11:]))
    held = planned_steps(newest)  # what the rerun resumes: its plan is where the resumed one starts
    assert held in printed, (held, printed, newest.name)

    launched = time.monotonic()
    # No evaluation but the final one in the resumed run: a stop inside an evaluation stops at once, with no window
    # (the module's rule; on CI steps of 0.02 s put the signal inside step 40's evaluation). Saves still re-plan.
    # A CPU made busy on purpose (a third process on CI's two cores) for the whole of it: the plan is made from
    # the steps as they run on that machine, and the run still ends inside its budget.
    with busy_cpu():
        second = start(env={**env, "MLM_EVAL_STEPS": "1000"})
        # SIGTERM again, once planned: the rest of the plan fits the 270 s to stop, so the run finishes as planned
        # after the stop's checkpoint, exit 0 (torchrun, signalled, exits 1: the ranks' recorded 0s say they
        # finished).
        wait_for(output / "checkpoint-30" / ".complete", second)
        second.send_signal(signal.SIGTERM)
        _, stderr = second.communicate(timeout=BUDGET_S + 60)
        took = time.monotonic() - launched
    assert second.returncode == 0, stderr[-3000:]
    assert took < BUDGET_S, f"the run took {took:.1f} s of its {BUDGET_S} s budget"
    run = json.loads((output / "run.json").read_text())
    budget = run["time_budget"]
    assert "steps left fit: finishing" in stderr and "a crash" not in stderr, stderr[-3000:]
    assert run["status"] == "finished" and budget["cut_short"]["whole_plan"], budget
    assert budget["cut_short"]["final_step"] == budget["planned_steps"]
    assert re.search(rf"resuming from \S*/{newest.name}\b", stderr) and budget["steps_set_by_options"] == held, held
    assert 10 < budget["planned_steps"] <= held and budget["plans"][0]["at_step"] > 10
    steps = [r for r in records(output / "logs" / "train.jsonl") if r.get("event") == "train" and "loss" in r]
    last = steps[-1]
    # The demo's scratch model gets the modern recipe: warmup-stable-decay, a 1-sqrt decay over the last 20 % of
    # the planned steps. The last step's rate is that decay's last before zero: the schedule ends at the plan.
    assert run["config"]["lr_scheduler_type"] == "warmup_stable_decay" and run["config"]["decay_ratio"] == 0.2
    total = budget["planned_steps"]
    assert last["step"] == total, last
    assert last["learning_rate"] == pytest.approx(last_rate(run)), last
    # The mask rate follows the plan as the learning rate does: its last step at the schedule's end.
    assert last["mlm_probability"] == pytest.approx(0.3 + (0.1 - 0.3) * (total - 1) / total, abs=1e-6), last
    # So does the batch warm-up: the global batch (2 ranks x 8) whole by the plan's end, a quarter at the start.
    banner = next(r for r in records(output / "logs" / "train.jsonl") if r["event"] == "banner")
    assert last["batch_rows"] == 16 and banner["batch_warmup"]["first_rows"] == 4, banner["batch_warmup"]
    assert json.loads((output / "all_results.json").read_text())["eval_loss"] > 0
    # quality against time: each evaluation of this session, the last one the final model's, inside the budget
    final = run["quality_curve"][-1]
    assert final["step"] == total and final["since_launch_s"] < BUDGET_S and final["tokens_seen"] > 0, final
    assert (output / "final" / "model.safetensors").exists()


def test_a_stop_in_a_budgeted_run_saves_then_decays_in_the_stop_window_to_a_stopped_final_that_a_rerun_resumes(
    tmp_path: Path,
) -> None:
    """SIGTERM in the stable phase of a budgeted run (the deadline come early): the checkpoint of the stop's step
    is saved as usual, then the steps that fit MLM_STOP_TIMEOUT run with the learning rate decaying to zero, and
    final/ is evaluated and written, marked as a stopped run's; exit 75. The output is then a run to resume, not a
    finished one: ``plan`` would resume the stop's checkpoint."""
    output = tmp_path / "out"
    # No evaluation after step 10's: a stop inside an evaluation stops at once, with no window (the module's rule;
    # on a loaded CI machine the signal often landed in step 20's evaluation). This test's stop is between steps.
    options = {**OPTIONS, "time_budget": "10m", "stop_timeout": str(STOP_TIMEOUT_S), "eval_steps": "1000"}
    env = tiny_env(output, **options)
    run = start(env=env)
    wait_for(output / "checkpoint-10" / ".complete", run)
    signalled = time.monotonic()
    run.send_signal(signal.SIGTERM)
    _, stderr = run.communicate(timeout=STOP_TIMEOUT_S + 60)
    took = time.monotonic() - signalled
    assert run.returncode == 75, stderr[-3000:]
    assert took < STOP_TIMEOUT_S, f"{took:.1f} s after the signal, of the {STOP_TIMEOUT_S} s torchrun gives"

    facts = json.loads((output / "run.json").read_text())
    cut = facts["time_budget"]["cut_short"]
    at, final_step, decay = cut["checkpoint_step"], cut["final_step"], cut["decay_steps"]
    assert facts["status"] == "preempted" and cut["signal"] == "SIGTERM" and not cut["whole_plan"], cut
    assert f"stopped by SIGTERM at step {at}; checkpoint saved as checkpoint-{at}" in stderr, stderr[-3000:]
    assert f"more steps decayed the learning rate and {output}/final holds that model (step {final_step}" in stderr
    assert final_step > at and 0 < decay <= cut["steps_after"], cut
    # No checkpoint of the decay: the newest is the stop's, what a rerun resumes.
    assert max(int(p.name.split("-")[1]) for p in output.glob("checkpoint-*")) == at
    steps = {
        r["step"]: r for r in records(output / "logs" / "train.jsonl") if r.get("event") == "train" and "loss" in r
    }
    peak = facts["config"]["learning_rate"]
    assert steps[at]["learning_rate"] == pytest.approx(peak)  # the stable phase
    assert steps[final_step]["learning_rate"] == pytest.approx(peak * (1 - math.sqrt((decay - 1) / decay)))
    assert max(steps) == final_step
    assert json.loads((output / "all_results.json").read_text())["eval_loss"] > 0
    assert json.loads((output / "final" / "cut_short.json").read_text()) == cut
    assert (output / "final" / "model.safetensors").exists()

    planned = entrypoint("plan", env=env, timeout=120)
    assert planned.returncode == 0, planned.stderr[-3000:]
    outputs = json.loads(planned.stdout)["output_dir"]
    assert (outputs["finished_model"], outputs["a run would"]) == (False, f"resume from checkpoint-{at}"), outputs
