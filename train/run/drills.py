"""Fault drills (``MLM_INJECT_FAULT``, train/config/resilience.py): a NaN loss or a spiking update injected at a
step, to rehearse what a run does then (train/run/rollback.py) before a week-long job meets one. The job adds the
drill's callback when the option is set; nothing else imports this module.

- ``nan@STEP``: that optimizer step's loss is multiplied by NaN in the model's forward (a forward hook), so its
  gradients, gradient norm and update are NaN as a real one's would be.
- ``spike@STEP``: that step's parameter update, after clipping and the optimizer, is multiplied by SPIKE_FACTOR
  (the parameters before the optimizer's step copied, then moved SPIKE_FACTOR times as far): a real spike.
- ``hang@STEP``: the rank stops at that step's start and sleeps without exiting, as a rank stuck in a driver call
  or a frozen node would: the launcher's hang watchdog (train/launch/watchdog.py) is what ends it.
- ``slow@RANK:FACTOR``: that rank's steps take FACTOR times as long, from the first, in every launch: it sleeps at
  the start of each forward pass in training for FACTOR - 1 times its previous step's own time, as a rank on a
  throttled GPU or a slow node would (train/run/stragglers.py names it).

``:RANK`` after the step fires it on that world rank alone (DDP's reduction carries a NaN to every rank; a spike
on one rank leaves the ranks' weights apart until the rollback reloads them). Each fault fires once in a run:
what fired is in output_dir's faults-fired.json (world rank 0 writes it, every rank reads it at its start), so
neither a rollback nor a restart fires it again."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from train.common import distributed
from train.common.console import say
from train.config.resilience import Fault
from train.outputs.record import write_json_atomic

SPIKE_FACTOR = 10000.0


class FaultDrill(TrainerCallback):
    """The drill's faults (``faults``), those that ``fired`` already read from and written to ``record``."""

    def __init__(self, faults: tuple[Fault, ...], record: Path) -> None:
        self.faults, self.record = faults, record
        self.fired: list[str] = fired_faults(record)
        self.armed: set[str] = set()  # the kinds armed on this rank for the step being trained
        self.before: list[torch.Tensor] = []
        self.hooked = False
        rank = distributed.world_rank()
        self.slow = next((f.factor for f in faults if f.kind == "slow" and f.hits(rank)), None)
        self.step_began, self.step_s, self.slept, self.slow_due = 0.0, 0.0, 0.0, False

    def facts(self) -> dict[str, Any]:
        """run.json's ``fault_drill``."""
        return {"faults": [f.name for f in self.faults], "fired": list(self.fired)}

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if not self.hooked and model is not None:
            model.register_forward_hook(self.nan_loss)
            if self.slow is not None:  # after the straggler clock's own hook: its sleep is counted as the rank's
                model.register_forward_pre_hook(self.slow_forward)
                say(f"fault drill: rank {distributed.world_rank()}'s steps take {self.slow:g}x as long", "warning")
            self.hooked = True

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step, rank = state.global_step + 1, distributed.world_rank()
        self.step_began, self.slept, self.slow_due = time.monotonic(), 0.0, self.slow is not None
        for fault in self.faults:
            if fault.kind == "slow" or fault.step != step or fault.name in self.fired:
                continue
            self.fired.append(fault.name)
            if distributed.is_world_zero():
                write_json_atomic(self.record, {"fired": self.fired})
                say(f"fault drill: {fault.name} fires", "warning")
            if fault.hits(rank):
                self.armed.add(fault.kind)
        if "hang" in self.armed:  # before the progress report's callback: this rank never says it began the step
            say(f"fault drill: rank {rank} stops making progress at step {step}", "warning")
            while True:
                time.sleep(60)

    def slow_forward(self, module: Any, inputs: Any) -> None:
        """At the step's first forward pass in training: FACTOR - 1 times the previous step's own time, asleep."""
        if self.slow is not None and self.slow_due and module.training:
            self.slow_due = False
            pause = (self.slow - 1) * self.step_s
            time.sleep(pause)
            self.slept += pause

    def nan_loss(self, module: Any, inputs: Any, output: Any) -> Any:
        if "nan" in self.armed and module.training and getattr(output, "loss", None) is not None:
            output.loss = output.loss * math.nan
        return output

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if "spike" in self.armed and model is not None:
            self.before = [p.detach().clone() for p in model.parameters()]

    def on_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.before and model is not None:
            with torch.no_grad():
                for before, parameter in zip(self.before, model.parameters(), strict=True):
                    parameter.copy_(before + SPIKE_FACTOR * (parameter - before))
            self.before = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.armed.clear()
        if self.slow is not None:  # the step's own time, this drill's sleep left out
            self.step_s = time.monotonic() - self.step_began - self.slept


def fired_faults(record: Path) -> list[str]:
    """The faults that fired in this output_dir before (their names), none where it holds no record; read as data."""
    try:
        names = json.loads(record.read_text()).get("fired")
    except (OSError, ValueError, AttributeError):
        return []
    return [str(n) for n in names] if isinstance(names, list) else []
