"""A run in two phases through the front door: 128-token blocks on a 70/30 mixture of two corpora, then 256-token
blocks on 30/70 with the decay; one output_dir, one schedule, and a SIGTERM in phase 2 resumed to the weights of
the run that was never stopped."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import tiny_env
from tests.e2e.runs import entrypoint, records, start, wait_for
from train.common.handoff import Handoff
from train.common.phase import PhaseFacts
from train.report.runlog import load_run
from train.run.job import PHASE_ENDED

pytestmark = pytest.mark.slow

PLAN = """\
model_name_or_path: scratch:distilbert
config_overrides: n_layers=2,n_heads=2,dim=64,hidden_dim=128
demo_samples: 1000
padding: packed
per_device_train_batch_size: 8
per_device_eval_batch_size: 32
learning_rate: 1.0e-3
lr_scheduler_type: warmup_stable_decay
warmup_steps: 2
logging_steps: 1
eval_strategy: steps
eval_steps: 4
save_strategy: steps
save_steps: 4
save_total_limit: 5
phases:
  - name: short-blocks
    steps: 8
    max_seq_length: 128
    dataset: {{demo: 0.7, {legal}: 0.3}}
  - name: long-blocks-decay
    steps: 8
    max_seq_length: 256
    dataset: {{demo: 0.3, {legal}: 0.7}}
    decay: true
"""


def phased_env(output: Path, plan: Path) -> dict[str, str]:
    env = tiny_env(output, config=str(plan))
    del env["MLM_NUM_TRAIN_EPOCHS"], env["MLM_DEMO_SAMPLES"]  # the phases give the run's length; the plan its data
    return env


def banners(output: Path) -> list[dict]:
    return [r for r in records(output / "logs" / "train.jsonl") if r["event"] == "banner"]


def test_two_phases_change_blocks_and_mixture_then_decay_and_a_stop_in_phase_2_resumes_identically(
    tmp_path: Path,
) -> None:
    legal = tmp_path / "legal.txt"
    legal.write_text(
        "".join(f"the licensee may copy and modify the work under clause {i} of this licence\n" for i in range(400))
    )
    plan = tmp_path / "phases.yaml"
    plan.write_text(PLAN.format(legal=legal))

    straight = tmp_path / "straight"
    done = entrypoint(env=phased_env(straight, plan))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "phase 1/2 short-blocks: steps 1-8 of 16" in done.stderr and "phase 2/2 long-blocks-decay" in done.stderr
    # Each phase's banner: its blocks, its mixture's token shares within 2 % of its weights.
    first, second = banners(straight)
    assert (first["phase"]["name"], second["phase"]["name"]) == ("short-blocks", "long-blocks-decay")
    for banner, weights in ((first, {"demo": 0.7, "legal": 0.3}), (second, {"demo": 0.3, "legal": 0.7})):
        shares = {m["key"]: m["share"] for m in banner["mixture"]}
        assert all(abs(shares[key] - weight) < 0.02 for key, weight in weights.items()), banner["mixture"]
    assert json.loads((straight / "checkpoint-8" / "mlm_options.json").read_text())["max_seq_length"] == 128
    assert json.loads((straight / "checkpoint-16" / "mlm_options.json").read_text())["max_seq_length"] == 256
    # One schedule over both phases: stable through phase 1, the decay in phase 2 only.
    rates = {r["step"]: r["learning_rate"] for r in records(straight / "logs" / "train.jsonl") if r["event"] == "train"}
    assert [rates[step] for step in range(3, 10)] == pytest.approx([1e-3] * 7)
    assert rates[16] < rates[12] < rates[10] <= 1e-3
    evaluations = [r for r in records(straight / "logs" / "train.jsonl") if r["event"] == "eval"]
    assert len(evaluations) >= 4 and all(r["eval_demo_loss"] > 0 and r["eval_legal_loss"] > 0 for r in evaluations)
    assert json.loads((straight / "run.json").read_text())["phase"]["index"] == 1
    assert load_run(straight).phase_starts == [(8, "long-blocks-decay")]  # the report marks where phase 2 began

    stopped = tmp_path / "stopped"
    env = phased_env(stopped, plan)
    process = start(env=env)
    wait_for(stopped / "checkpoint-12" / ".complete", process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)  # a bound against a hang, not a measurement
    assert process.returncode == 75, stderr[-3000:]
    assert not (stopped / "final").exists()
    resumed = entrypoint(env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "phase 1/2 short-blocks: steps 1-8 of 16: trained already" in resumed.stderr
    assert (stopped / "final" / "model.safetensors").read_bytes() == (
        straight / "final" / "model.safetensors"
    ).read_bytes()


def test_a_phase_that_ends_records_75_for_its_launcher(tmp_path: Path, job_in_process: Callable[..., int]) -> None:
    """A phase that is not the last ends with its checkpoint and exit 0, and records 75 for its launcher: a stop
    signal landing from there to the exit (torchrun, signalled, exits 1 whatever its ranks did) stops the plan
    with the code of a run to run again (the next phase starts), neither a crash nor a start of the next phase."""
    output = tmp_path / "out"
    exits = tmp_path / "exits"
    exits.mkdir()
    phase = PhaseFacts(index=0, count=2, name="first", start=0, end=4, total=8, decay_steps=None)
    handoff = Handoff(precision="fp32", global_batch_size=8, batch="", nnodes="1", phase=phase.record())
    env = tiny_env(output, max_steps="4", per_device_train_batch_size="8", exit_dir=str(exits), launch=handoff.to_env())
    assert job_in_process(env) == 0
    assert (exits / "rank-0.exit").read_text() == "75"
    assert json.loads((output / "run.json").read_text())["status"] == PHASE_ENDED
    assert (output / "checkpoint-4" / ".complete").exists() and not (output / "final").exists()
