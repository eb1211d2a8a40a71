"""The fault drills (train/run/drills.py) on a small module: each fault fires at its step, on its rank, once in a
run (a new drill on the same output_dir does not fire it again)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from transformers import TrainerControl, TrainerState

from train.config.resilience import parse_faults
from train.run.drills import SPIKE_FACTOR, FaultDrill


class Scored(torch.nn.Module):
    """A module whose output carries a loss, as a masked-LM's does."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> Any:
        return SimpleNamespace(loss=(self.weight * x).sum())


def drill(text: str, root: Path) -> FaultDrill:
    return FaultDrill(parse_faults(text) or (), root / "faults-fired.json")


def test_nan_makes_that_steps_loss_nan_and_fires_once(tmp_path: Path) -> None:
    model, state, control = Scored(), TrainerState(global_step=3), TrainerControl()
    first = drill("nan@5", tmp_path)
    first.on_train_begin(None, state, control, model=model)
    first.on_step_begin(None, state, control)  # step 4
    assert math.isfinite(model(torch.ones(3)).loss.item())
    state.global_step = 4
    first.on_step_begin(None, state, control)  # step 5
    assert math.isnan(model(torch.ones(3)).loss.item())
    first.on_step_end(None, state, control)
    assert math.isfinite(model(torch.ones(3)).loss.item())
    assert first.facts() == {"faults": ["nan@5"], "fired": ["nan@5"]}
    first.on_step_begin(None, state, control)  # step 5 again, after a rollback: not again
    assert math.isfinite(model(torch.ones(3)).loss.item())
    again = drill("nan@5", tmp_path)  # a restart on the same output_dir
    assert again.fired == ["nan@5"]


def test_spike_multiplies_that_steps_update(tmp_path: Path) -> None:
    model, state, control = Scored(), TrainerState(global_step=6), TrainerControl()
    spike = drill("spike@7", tmp_path)
    spike.on_step_begin(None, state, control)
    spike.on_pre_optimizer_step(None, state, control, model=model)
    with torch.no_grad():
        model.weight.sub_(0.01)  # the optimizer's update
    spike.on_optimizer_step(None, state, control, model=model)
    assert torch.allclose(model.weight, torch.full((3,), 1 - 0.01 * SPIKE_FACTOR))


def test_a_fault_for_another_rank_fires_here_as_recorded_but_does_nothing(tmp_path: Path) -> None:
    model, state, control = Scored(), TrainerState(global_step=1), TrainerControl()
    other = drill("nan@2:1", tmp_path)  # this process is world rank 0
    other.on_train_begin(None, state, control, model=model)
    other.on_step_begin(None, state, control)
    assert math.isfinite(model(torch.ones(3)).loss.item()) and other.fired == ["nan@2:1"]


def test_slow_makes_its_ranks_steps_take_factor_times_as_long_in_every_launch(tmp_path: Path, monkeypatch: Any) -> None:
    """slow@0:3 on rank 0: from the second step, its first forward pass in training sleeps twice the step before's
    own time (the sleep left out of it); another rank is untouched; nothing is recorded as fired."""
    monkeypatch.setenv("RANK", "0")
    model, state, control = Scored(), TrainerState(global_step=0), TrainerControl()
    slowed, other = drill("slow@0:3", tmp_path), drill("slow@1:3", tmp_path)
    assert (slowed.slow, other.slow) == (3.0, None)
    slowed.on_train_begin(None, state, control, model=model)
    slowed.on_step_begin(None, state, control)
    time.sleep(0.05)  # the first step's own work: nothing before it to scale
    model(torch.ones(3))
    slowed.on_step_end(None, state, control)
    assert 0.05 <= slowed.step_s < 0.1
    slowed.on_step_begin(None, state, control)
    started = time.monotonic()
    model(torch.ones(3))
    model(torch.ones(3))  # a second micro-batch's forward: once a step
    model.eval()
    model(torch.ones(3))  # an evaluation's: never
    assert 2 * slowed.step_s <= time.monotonic() - started < 2 * slowed.step_s + 0.05
    slowed.on_step_end(None, state, control)
    assert slowed.step_s < 0.05  # its own time, the sleep left out
    assert not (tmp_path / "faults-fired.json").exists()
