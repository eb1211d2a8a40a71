"""A budgeted run's stop signal as the deadline come early (train/run/budget.py's rule): the steps after the stop's
checkpoint, and the record run.json and final/cut_short.json keep of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CutShort:
    """A budgeted run's stop: the checkpoint of ``at_step``, then ``steps`` more, the last ``decay_steps`` decaying."""

    signal: str
    at_step: int
    steps: int
    decay_steps: int
    whole_plan: bool  # the plan's own remaining steps fit: the run finishes as planned
    window_s: float  # the time the stop left, from the signal

    @property
    def final_step(self) -> int:
        return self.at_step + self.steps

    def record(self) -> dict[str, Any]:
        return {
            "signal": self.signal,
            "checkpoint_step": self.at_step,
            "steps_after": self.steps,
            "decay_steps": self.decay_steps,
            "final_step": self.final_step,
            "whole_plan": self.whole_plan,
            "window_s": round(self.window_s, 1),
        }


def steps_after_stop(left: int, fit: int, decay_ahead: int) -> tuple[int, int]:
    """(steps, of which decaying) after a stop: the ``fit`` steps, or the plan's ``left`` when they fit; the decay
    the last ``decay_ahead`` (the plan's) of them at most. (0, 0): none fits."""
    steps = max(min(fit, left), 0)
    return steps, min(steps, decay_ahead)
