"""The time budget's arithmetic (train/run/budget_costs.py): the steps that fit, what a step costs from its times
(the mean, a stall capped, the larger of two windows), whether a plan made again on the steps' pace is taken; and
the callback (train/run/budget.py) making that plan every PACE_STEPS steps on a clock the test moves."""

from __future__ import annotations

import math
from typing import Any

import pytest
from transformers import TrainerControl

from tests.run.test_budget import Clock, arguments, begun, budget_handoff, drive
from train.run import budget as budget_module
from train.run.budget import WARMUP_STEPS, TimeBudget
from train.run.budget_costs import (
    LONG_WINDOW,
    PACE_EARLY,
    PACE_LATE,
    PACE_STEPS,
    STEP_WINDOW,
    Costs,
    pace_moves,
    step_cost,
    step_time,
    steps_that_fit,
)


def test_the_steps_that_fit_leave_the_final_work_and_the_margin() -> None:
    costs = Costs(step=1.0, evaluation=4.0, evaluate_every=4, save=2.0, save_every=10, final=5.0)
    assert costs.per_step() == pytest.approx(2.2)
    assert steps_that_fit(now=0, deadline=100, costs=costs, margin=7) == math.floor(88 / 2.2)
    assert steps_that_fit(now=95, deadline=100, costs=costs, margin=7) == 0
    none = Costs(step=0.5, evaluation=0, evaluate_every=math.inf, save=0, save_every=math.inf, final=0)
    assert steps_that_fit(now=0, deadline=10, costs=none, margin=0) == 20


def test_a_step_costs_its_mean_wall_time_with_one_stall_capped() -> None:
    # A loaded machine: one step in three waits for the CPU. The median (0.1 s) would plan three times too many.
    assert step_time([0.1, 0.1, 0.7] * 5) == pytest.approx(0.3)
    # One stall of 60 s among 0.1-s steps counts as ten steps' time, not six hundred.
    assert step_time([0.1] * 19 + [60.0]) == pytest.approx((19 * 0.1 + 1.0) / 20)


def test_a_slowdown_costs_at_once_and_a_speed_up_once_it_lasts() -> None:
    assert (STEP_WINDOW, LONG_WINDOW) == (20, 60)
    # Steps slowed from 0.5 s to 1 s twenty steps ago: the short window's 1 s (the long one's mean is 0.67 s).
    assert step_cost([0.5] * 40 + [1.0] * 20) == pytest.approx(1.0)
    # Sped up from 1 s to 0.5 s twenty steps ago: still the long window's 0.83 s (the short one's is 0.5 s) ...
    assert step_cost([1.0] * 60 + [0.5] * 20) == pytest.approx((40 * 1.0 + 20 * 0.5) / 60)
    # ... and 0.5 s once the long window holds only the faster steps.
    assert step_cost([1.0] * 40 + [0.5] * 60) == pytest.approx(0.5)
    # Fewer steps than either window (the first plan's three): their mean.
    assert step_cost([0.4, 0.5, 0.6]) == pytest.approx(0.5)


def test_a_plan_on_the_pace_is_taken_when_its_end_moves_far_enough() -> None:
    assert (PACE_STEPS, PACE_LATE, PACE_EARLY) == (20, 0.1, 0.5)
    # Planned to step 200, at step 100: 100 steps left. Sooner by more than 10, or later by more than 50.
    assert not pace_moves(200, 190, 100) and pace_moves(200, 189, 100)
    assert not pace_moves(200, 250, 100) and pace_moves(200, 251, 100)
    assert not pace_moves(200, 200, 100)
    # The same move weighs by the steps left: 20 steps sooner is a re-plan with 100 left, not with 300.
    assert pace_moves(200, 180, 100) and not pace_moves(400, 380, 100)


def test_every_pace_steps_the_plan_is_made_again_and_taken_when_the_steps_slowed(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Steps at 0.5 s, planned at step 5; made again at step 25 on the same pace, not taken; the steps slow to 1 s:
    at step 45 the plan, made again, ends far sooner, and is taken (the schedule rebuilt for it). The plan is made
    at these steps only, each one a collective's (agreed_minimum), so every rank makes it at the same step."""
    clock = Clock()
    monkeypatch.setattr(budget_module, "time", clock)
    agreed_at: list[int] = []
    state_of: dict[str, Any] = {}

    def agreed_minimum(value: int, device: Any) -> int:
        agreed_at.append(state_of["state"].global_step)
        return value

    monkeypatch.setattr(budget_module, "agreed_minimum", agreed_minimum)
    callback = TimeBudget(budget_handoff(clock.now, 200, "200s"), eval_batches=0, checkpoint_mb=0.0)
    args = arguments(tmp_path, max_steps=10_000, warmup_steps=0)
    state, tools = begun(callback, args, warmup=0)
    state_of["state"] = state
    for _ in range(WARMUP_STEPS + 3 + 20):
        drive(callback, args, state, clock, 0.5, **tools)
    plan = callback.plan
    # Planned at step 5 (1,002.5 s): 187.5 s before the margin, 375 steps of 0.5 s. At 25 the same end: kept.
    assert agreed_at == [5, 25] and plan.total == 380 and len(plan.plans) == 1
    for _ in range(20):
        drive(callback, args, state, clock, 1.0, **tools)
    # At step 45 (1,032.5 s) a step costs 1 s (the short window's): 157 steps fit, 178 sooner than 380, more than
    # a tenth of the 335 left.
    assert agreed_at == [5, 25, 45] and plan.total == state.max_steps == 45 + 157
    assert plan.plans[-1]["at_step"] == 45 and plan.plans[-1]["on_pace"] and plan.plans[-1]["step_s"] == 1.0
    assert tools["lr_scheduler"].lr_lambdas[0](202) == 0.0  # the schedule ends at the new plan
    said = capsys.readouterr().err
    assert "re-planned at step 45: 202 steps, set by the time budget (the steps' pace moved the end from step 380)" in (
        said
    )
    for _ in range(9):
        drive(callback, args, state, clock, 1.0, **tools)
    # An evaluation re-plans as before, whatever the pace, and the next plan on the pace counts from it.
    callback.on_evaluate(args, state, TrainerControl())
    drive(callback, args, state, clock, 1.0, **tools)
    assert agreed_at == [5, 25, 45, 55] and "on_pace" not in plan.plans[-1]
    for _ in range(PACE_STEPS - 1):
        drive(callback, args, state, clock, 1.0, **tools)
    assert agreed_at == [5, 25, 45, 55]
    drive(callback, args, state, clock, 1.0, **tools)
    assert agreed_at == [5, 25, 45, 55, 75]
