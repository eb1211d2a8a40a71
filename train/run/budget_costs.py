"""The time budget's arithmetic: what a step costs, what the rest of the run costs, the steps that fit before the
deadline, the margin kept before it, and whether a plan made again on the steps' pace is taken. The rule these
serve is stated once, in train/run/budget.py's docstring; the callback there feeds them its measured times."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from train.common.schedules import BatchWarmup

MARGIN_FRACTION = 0.05
MIN_MARGIN_S = 10.0
STEP_WINDOW = 20
LONG_WINDOW = 60  # a step costs the larger of the two windows' means (step_cost)
STALL_CAP = 10
PACE_STEPS = 20  # steps after a plan, the plan is made again from the steps' pace
PACE_LATE = 0.1  # ... and taken when its end moves sooner by more than this share of the steps left
PACE_EARLY = 0.5  # ... or later by more than this share of them


@dataclass(frozen=True)
class Costs:
    """What the rest of the run costs, in seconds."""

    step: float
    evaluation: float  # one evaluation pass (0 when the run does not evaluate)
    evaluate_every: float  # steps between evaluations (inf: none before the end)
    save: float  # one checkpoint
    save_every: float
    final: float  # the final evaluation, the model's write and its publishing

    def per_step(self) -> float:
        return self.step + self.evaluation / self.evaluate_every + self.save / self.save_every


def steps_that_fit(
    now: float, deadline: float, costs: Costs, margin: float, at: int = 0, warmup: BatchWarmup | None = None
) -> int:
    """Steps that end, with their share of evaluations and saves, the final work and the margin, by ``deadline``.
    Under a batch warm-up (``costs.step`` then a full step's time) the steps after ``at`` cost their share of the
    batch, and the ramp is a share of the plan: the most steps whose cost fits (it grows with the steps)."""
    left = deadline - now - costs.final - margin
    if left <= 0:
        return 0
    fit = max(math.floor(left / costs.per_step()), 0)  # every step a full one: at least these fit
    if warmup is None or fit == 0:
        return fit
    others = costs.per_step() - costs.step  # evaluations' and saves' shares: the same whatever the batch

    def fits(steps: int) -> bool:
        return costs.step * warmup.full_steps(at, at + steps) + others * steps <= left

    low, high = fit, math.ceil(fit * warmup.full / warmup.unit) + 1  # no step is cheaper than the smallest batch's
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def step_time(times: Sequence[float]) -> float:
    """What ``times`` say a step costs in wall time: their mean, each at most ``STALL_CAP`` times their median."""
    cap = STALL_CAP * statistics.median(times)
    return statistics.fmean(min(took, cap) for took in times)


def step_cost(times: Sequence[float]) -> float:
    """What a step costs now, from the steps timed so far (one at least: every plan comes after a timed step): the
    larger of :func:`step_time` over the last ``STEP_WINDOW`` of them and over the last ``LONG_WINDOW``. A slowdown
    raises the short window's mean at once; a speed-up lowers the cost only once the long window holds it too."""
    return max(step_time(times[-STEP_WINDOW:]), step_time(times[-LONG_WINDOW:]))


def pace_moves(planned: int, total: int, at: int) -> bool:
    """Whether a plan made again on the steps' pace at step ``at`` is taken: its last step ``total`` comes sooner
    than the ``planned`` one by more than ``PACE_LATE`` of the steps left, or later by more than ``PACE_EARLY`` of
    them. Smaller moves leave the plan, and the learning rate's schedule, as they are."""
    left = planned - at
    return total < planned - PACE_LATE * left or total > planned + PACE_EARLY * left


def margin_for(budget_s: float) -> float:
    return max(MARGIN_FRACTION * budget_s, MIN_MARGIN_S)
