"""A phased run's plan (train/launch/phases.py): each phase's place in one schedule, its options, tokens turned
into steps; what a phased run refuses; which phases a rerun skips."""

from __future__ import annotations

from pathlib import Path

from tests.launch.common import plan_ok, run_plan
from train.common.handoff import HANDOFF_ENV, Handoff
from train.common.phase import PhaseFacts
from train.launch.phases import run_phases

PLAN = """\
model_name_or_path: scratch:distilbert
config_overrides: n_layers=2,n_heads=2,dim=64,hidden_dim=128
dataset: demo
per_device_train_batch_size: 8
lr_scheduler_type: warmup_stable_decay
phases:
  - {name: short, steps: 10, max_seq_length: 64}
  - {name: long, tokens: 10000, max_seq_length: 128, per_device_train_batch_size: 4, decay: true}
"""


def test_plan_shows_every_phase_in_one_schedule(monkeypatch, capsys, base_env, no_nvml, tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(PLAN)
    document = plan_ok(monkeypatch, capsys, base_env, "--config", str(tmp_path / "plan.yaml"), "--nproc_per_node", "1")
    short, long = document["phases"]
    # 10,000 positions at 4 x 128 per step: 20 steps (rounded up); the decay is the long phase's.
    assert (short["start"], short["end"], long["start"], long["end"], long["total"]) == (0, 10, 10, 30, 30)
    assert short["decay_steps"] == long["decay_steps"] == 20
    assert long["options"] == {"max_seq_length": 128, "per_device_train_batch_size": 4}
    command = document["command"]  # the first phase's launch
    assert command[command.index("--max_steps") + 1] == "10" and "--config" in command
    handoff = Handoff.from_environ({HANDOFF_ENV: document["env"][HANDOFF_ENV]})
    assert handoff is not None and handoff.phase is not None and handoff.phase["name"] == "short"


def test_a_phased_run_refuses_a_length_of_its_own(monkeypatch, capsys, base_env, no_nvml, tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(PLAN)
    code, _, err = run_plan(
        monkeypatch, capsys, {**base_env, "MLM_MAX_STEPS": "100"}, "--config", str(tmp_path / "plan.yaml")
    )
    assert code == 2 and "MLM_MAX_STEPS: a run in phases" in err
    # A batch warm-up makes the first steps smaller: a phase given in tokens would train fewer than it says.
    code, _, err = run_plan(
        monkeypatch, capsys, {**base_env, "MLM_BATCH_WARMUP_RATIO": "0.5"}, "--config", str(tmp_path / "plan.yaml")
    )
    assert code == 2 and "phase long: a length in tokens counts full batches, and MLM_BATCH_WARMUP_RATIO=0.5" in err


def test_each_phase_hands_its_place_to_the_ranks_and_a_rerun_skips_the_phases_done() -> None:
    phases = [PhaseFacts(0, 2, "a", 0, 10, 30, None), PhaseFacts(1, 2, "b", 10, 30, 30, None)]
    said: list[str] = []
    started: list[str] = []

    class Planned:
        def __init__(self, facts: PhaseFacts) -> None:
            self.facts = facts

    code = run_phases([Planned(f) for f in phases], 12, said.append, lambda p: started.append(p.facts.name) or 0)
    assert code == 0 and started == ["b"]
    assert said == ["phase 1/2 a: steps 1-10 of 30: trained already (checkpoint at step 12)",
                    "phase 2/2 b: steps 11-30 of 30, resuming at step 12"]  # fmt: skip
    stops: list[str] = []
    code = run_phases([Planned(f) for f in phases], 0, said.append, lambda p: stops.append(p.facts.name) or 75)
    assert code == 75 and stops == ["a"]  # a stopped phase ends the run: the next one does not start
    assert PhaseFacts.from_record(phases[1].record()) == phases[1]
    assert PhaseFacts.from_record({**phases[0].record(), "end": "10"}) is None  # a hand-off is read as data
    assert PhaseFacts.from_record({**phases[0].record(), "start": 10}) is None
