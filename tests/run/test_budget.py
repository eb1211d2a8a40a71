"""The time budget's planning on one rank (train/run/budget.py): the schedule rebuilt for the plan, and the callback
driven through steps, an evaluation and a save on a clock the test moves (its arithmetic:
tests/run/test_budget_costs.py). A whole budgeted run, resumed and re-planned, on two ranks:
tests/e2e/test_budget.py."""

from __future__ import annotations

import math
import signal
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import TrainerControl, TrainerState, TrainingArguments, get_scheduler

from train.common.handoff import Handoff
from train.run import budget as budget_module
from train.run.budget import WARMUP_STEPS, TimeBudget, late_decay, steps_after_stop
from train.run.budget_costs import Costs, margin_for, steps_that_fit
from train.run.budget_schedule import decay_after, decay_ahead, schedule_for, warmup_for
from train.run.preemption import StopOnSignal


def arguments(tmp_path: Any, **options: Any) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **options)


def test_a_warmup_longer_than_half_the_plan_becomes_a_tenth(tmp_path: Any) -> None:
    assert warmup_for(100, arguments(tmp_path, warmup_steps=50)) == 50
    assert warmup_for(100, arguments(tmp_path, warmup_steps=51)) == 10
    assert warmup_for(100, arguments(tmp_path, warmup_steps=0.2)) == 20


def lrs(scheduler: Any, optimizer: Any, steps: int) -> list[float]:
    seen = []
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        seen.append(scheduler.get_last_lr()[0])
    return seen


def test_the_schedule_is_rebuilt_to_end_at_the_planned_step(tmp_path: Any) -> None:
    args = arguments(tmp_path, warmup_steps=2, learning_rate=1.0)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=2, num_training_steps=1000)
    before = lrs(scheduler, optimizer, 3)  # a few steps on the configured 1,000
    assert schedule_for(10, args, scheduler, optimizer, 0.2) == 2
    # The step ahead (the fourth) trains at the new plan's rate already, not the old one's: a plan re-made one step
    # before its end ended at the old plan's rate.
    assert before[-1] == pytest.approx((1000 - 3) / (1000 - 2))
    assert optimizer.param_groups[0]["lr"] == scheduler.get_last_lr()[0] == pytest.approx((10 - 3) / (10 - 2))
    after = lrs(scheduler, optimizer, 7)
    assert after[-1] == 0.0 and after == sorted(after, reverse=True)  # decayed to zero at step 10
    assert after[0] == pytest.approx((10 - 4) / (10 - 2))


def test_warmup_stable_decay_is_rebuilt_to_decay_over_its_share_of_the_plan(tmp_path: Any) -> None:
    # The modern recipe's schedule (train/config/recipes.py): a plan of 20 steps decays over the last 20 %.
    args = arguments(
        tmp_path, warmup_steps=2, learning_rate=1.0, lr_scheduler_type="warmup_stable_decay",
        lr_scheduler_kwargs={"decay_type": "linear"},
    )  # fmt: skip
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = get_scheduler(
        "warmup_stable_decay", optimizer=optimizer, num_warmup_steps=2, num_training_steps=1000,
        scheduler_specific_kwargs={"num_decay_steps": 200, "decay_type": "linear"},
    )  # fmt: skip
    lrs(scheduler, optimizer, 3)
    assert schedule_for(20, args, scheduler, optimizer, 0.2) == 2
    after = lrs(scheduler, optimizer, 17)  # the rates after 4..20 scheduler steps
    assert after[:13] == [1.0] * 13  # warm-up 2, stable to 16
    assert after[13:] == pytest.approx([0.75, 0.5, 0.25, 0.0])  # 4 decay steps (20 % of 20) reach zero at 20


def test_a_schedule_that_is_no_function_of_the_step_is_said(tmp_path: Any, capsys: pytest.CaptureFixture) -> None:
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    args = SimpleNamespace(lr_scheduler_type="reduce_lr_on_plateau")
    assert schedule_for(10, args, plateau, optimizer, 0.2) is None
    assert "lr_scheduler_type reduce_lr_on_plateau does not follow the planned steps" in capsys.readouterr().err


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def time(self) -> float:
        return self.now

    monotonic = time


def budget_handoff(now: float, seconds: float, asked: str) -> Handoff:
    """The launcher's handoff of ``MLM_TIME_BUDGET=asked``: ``seconds`` from ``now``."""
    return Handoff("fp32", 8, "batch", "1", deadline=now + seconds, deadline_source=f"MLM_TIME_BUDGET={asked}",
                   budget_s=seconds)  # fmt: skip


def drive(callback: TimeBudget, args: Any, state: TrainerState, clock: Clock, seconds: float, **kwargs: Any) -> Any:
    """One step that took ``seconds``."""
    control = TrainerControl()
    clock.now += seconds
    state.global_step += 1
    callback.on_step_end(args, state, control, **kwargs)
    return control


def first_plan(callback: TimeBudget, args: Any, state: TrainerState, clock: Clock, scheduler: Any) -> dict:
    """The run begun and its first plan made, on steps of 0.5 s; the tools the callback is driven with."""
    tools = {"lr_scheduler": scheduler, "optimizer": scheduler.optimizer}
    callback.on_train_begin(args, state, TrainerControl(), **tools)
    for _ in range(WARMUP_STEPS + 3):
        drive(callback, args, state, clock, 0.5, **tools)
    return tools


def test_the_plan_follows_measured_steps_evaluations_and_saves(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    clock = Clock()
    monkeypatch.setattr(budget_module, "time", clock)
    handoff = budget_handoff(clock.now, 200, "200s")
    callback = TimeBudget(handoff, eval_batches=3, checkpoint_mb=20.0)
    measured: list[tuple[float, int]] = []

    def size_evaluation(budget_s: float, batches: int, device: Any) -> tuple[int, float]:
        measured.append((budget_s, batches))
        return batches, 0.25  # kept whole; one batch measured at 0.25 s

    callback.size_evaluation = size_evaluation
    args = arguments(tmp_path, max_steps=10_000, warmup_steps=5, eval_strategy="steps", eval_steps=50,
                     save_strategy="steps", save_steps=50)  # fmt: skip
    state = TrainerState()
    state.max_steps, state.eval_steps, state.save_steps = 10_000, 50, 50
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=5, num_training_steps=10_000)
    tools = {"lr_scheduler": scheduler, "optimizer": optimizer}
    callback.on_train_begin(args, state, TrainerControl(), **tools)
    for _ in range(WARMUP_STEPS):
        drive(callback, args, state, clock, 3.0, **tools)  # slow first steps are not counted
    for _ in range(3):
        drive(callback, args, state, clock, 0.5, **tools)
    plan = callback.plan
    # Until 1,200 s, from 1,007.5 s; the margin 10 s; an evaluation 3 batches x 0.25 s measured = 0.75 s every 50
    # steps; a save 20 MB at 200 MB/s every 50; the final evaluation + 2/3 of a save.
    costs = Costs(step=0.5, evaluation=0.75, evaluate_every=50, save=0.1, save_every=50, final=0.75 + 0.2 / 3)
    expected = 5 + steps_that_fit(1_007.5, 1_200, costs, 10)
    assert measured == [(200, 3)]  # measured once, at the first plan
    assert callback.costs(args, state) == costs
    assert plan.plans[0]["evaluation_s"] == 0.75 and plan.plans[0]["evaluation_batch_s"] == 0.25
    assert plan.total == state.max_steps == expected
    assert plan.cap == 10_000
    said = capsys.readouterr().err
    assert f"time budget: planned at step 5: {expected} steps, set by the time budget; a step 0.5 s" in said

    # An evaluation and a save much slower than estimated: the next step re-plans, shorter.
    clock.now += 20
    callback.on_evaluate(args, state, TrainerControl())
    clock.now += 10
    callback.on_save(args, state, TrainerControl())
    drive(callback, args, state, clock, 0.5, **tools)
    assert plan.total is not None and plan.total < expected and len(measured) == 1
    assert plan.plans[-1]["evaluation_s"] == 20 and plan.plans[-1]["save_s"] == 10
    assert "re-planned at step 6" in capsys.readouterr().err

    # The planned step stops the run, whoever else would go on; a save just before it, with time to spare, does
    # not draw a longer plan there (the Trainer has stopped at the planned step already).
    callback.on_save(args, state, TrainerControl())
    state.global_step = last = plan.total - 1
    assert drive(callback, args, state, clock, 0.5, **tools).should_training_stop
    assert plan.total == last + 1 and len(plan.plans) == 2, plan.plans
    assert plan.record()["planned_steps"] == plan.total and plan.record()["steps_set_by_options"] == 10_000


def test_a_run_that_does_not_evaluate_measures_no_evaluation(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """eval_strategy no (or no held-out set: no batches): the first plan measures nothing and counts no evaluation."""
    clock = Clock()
    monkeypatch.setattr(budget_module, "time", clock)

    def size_evaluation(budget_s: float, batches: int, device: Any) -> tuple[int, float]:
        raise AssertionError("measured an evaluation the run does not make")

    for eval_strategy, batches in (("no", 3), ("steps", 0)):
        callback = TimeBudget(budget_handoff(clock.now, 200, "200s"), eval_batches=batches, checkpoint_mb=20.0)
        callback.size_evaluation = size_evaluation
        args = arguments(tmp_path, max_steps=10_000, eval_strategy=eval_strategy, eval_steps=50)
        state, tools = begun(callback, args, warmup=0)
        for _ in range(WARMUP_STEPS + 3):
            drive(callback, args, state, clock, 0.5, **tools)
        assert callback.plan.plans[0]["evaluation_s"] == 0 and "evaluation_batch_s" not in callback.plan.plans[0]


def test_a_resumed_run_keeps_its_earlier_plan_from_the_first_step(tmp_path: Any) -> None:
    handoff = budget_handoff(1e12 - 3600, 3600, "1h")
    callback = TimeBudget(handoff, eval_batches=0, checkpoint_mb=1.0)
    callback.resumed_total = 40
    args = arguments(tmp_path, max_steps=1000, warmup_steps=0)
    state = SimpleNamespace(max_steps=1000, global_step=30)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0, num_training_steps=1000)
    callback.on_train_begin(args, state, TrainerControl(), lr_scheduler=scheduler, optimizer=optimizer)
    assert state.max_steps == 40 and callback.plan.cap == 40
    assert scheduler.lr_lambdas[0](40) == 0.0


def test_after_a_stop_the_steps_that_fit_run_and_the_last_of_them_decay() -> None:
    assert steps_after_stop(left=500, fit=30, decay_ahead=100) == (30, 30)  # the window is shorter than the decay
    assert steps_after_stop(left=500, fit=300, decay_ahead=100) == (300, 100)  # stable, then the plan's decay
    assert steps_after_stop(left=20, fit=300, decay_ahead=20) == (20, 20)  # the plan's end fits: as planned
    assert steps_after_stop(left=500, fit=0, decay_ahead=100) == (0, 0)


def test_the_decay_after_a_stop_starts_at_the_stops_rate_and_keeps_the_schedules_shape(tmp_path: Any) -> None:
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0, num_training_steps=100)
    lrs(scheduler, optimizer, 10)  # at step 10 the rate is 0.9
    decay_after(scheduler, at=10, stable=2, decay=4, kind="linear", kwargs={})
    assert lrs(scheduler, optimizer, 7) == pytest.approx([0.9, 0.9, 0.675, 0.45, 0.225, 0.0, 0.0])
    wsd = get_scheduler("warmup_stable_decay", optimizer=optimizer, num_warmup_steps=0, num_training_steps=100,
                        scheduler_specific_kwargs={"num_decay_steps": 20, "decay_type": "1-sqrt"})  # fmt: skip
    decay_after(wsd, at=0, stable=0, decay=4, kind="warmup_stable_decay", kwargs={"decay_type": "1-sqrt"})
    assert [wsd.lr_lambdas[0](step) for step in range(5)] == pytest.approx([1, 1 - 0.5, 1 - 0.5**0.5, 1 - 0.75**0.5, 0])
    args = arguments(tmp_path, warmup_steps=10, lr_scheduler_type="warmup_stable_decay")
    assert decay_ahead("warmup_stable_decay", args, total=100, at=30, decay_ratio=0.2) == 20  # the stable phase
    assert decay_ahead("warmup_stable_decay", args, total=100, at=90, decay_ratio=0.2) == 10  # inside the decay
    assert decay_ahead("linear", args, total=100, at=30, decay_ratio=0.2) == 70  # it decays all along


def planned_with_a_stopper(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, budget: tuple[float, str], stop_timeout_s: int
) -> tuple[Clock, Handoff, StopOnSignal, TimeBudget, Any, TrainerState, dict]:
    """A run with a time budget (``budget``: seconds, as asked) that saves every 50 steps, with a stopper, begun and
    planned on steps of 0.5 s, on a clock the test moves."""
    clock = Clock()
    monkeypatch.setattr(budget_module, "time", clock)
    handoff = budget_handoff(clock.now, *budget)
    monkeypatch.setattr(signal, "signal", lambda *handler: None)  # the test process keeps its own handlers
    stopper = StopOnSignal()
    callback = TimeBudget(handoff, eval_batches=0, checkpoint_mb=1.0, stopper=stopper, stop_timeout_s=stop_timeout_s)
    args = arguments(tmp_path, max_steps=10_000, warmup_steps=5, save_strategy="steps", save_steps=50)
    state = TrainerState()
    state.max_steps, state.save_steps = 10_000, 50
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=5, num_training_steps=10_000)
    return clock, handoff, stopper, callback, args, state, first_plan(callback, args, state, clock, scheduler)


def test_a_stop_after_the_first_plan_goes_on_for_the_window_then_stops_without_saving(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    clock, handoff, stopper, callback, args, state, tools = planned_with_a_stopper(
        tmp_path, monkeypatch, (3600, "1h"), 60
    )
    planned = callback.plan.total
    assert planned is not None and planned > 1000
    # SIGTERM at step 5; the ranks agree at the step's end, save its checkpoint (1 s), and on_save decides.
    stopper.received, stopper.received_at, stopper.stopped = signal.SIGTERM, clock.now, True
    control = TrainerControl(should_training_stop=True)
    clock.now += 1.0
    callback.on_save(args, state, control, **tools)
    # 60 s from the signal: 1 s gone, the final write 2/3 of a save, a margin of 10 s: 48.33 s of 0.5 s steps
    cut = callback.cut
    assert cut is not None and (cut.at_step, cut.steps, cut.decay_steps, cut.whole_plan) == (5, 96, 96, False)
    assert not control.should_training_stop and stopper.finishing
    assert state.max_steps == callback.plan.total == 101
    assert [tools["lr_scheduler"].lr_lambdas[0](step) for step in (5, 53, 101)] == pytest.approx([1.0, 0.5, 0.0])
    assert "stopped by SIGTERM at step 5, its checkpoint saved (what a rerun resumes): 96 more steps" in (
        capsys.readouterr().err
    )
    assert callback.plan.record()["cut_short"]["final_step"] == 101
    for _ in range(95):  # no re-plan, no save, no evaluation on the way
        step_control = TrainerControl(should_save=True, should_evaluate=True)
        stopper.on_step_end(args, state, step_control)
        assert not (step_control.should_save or step_control.should_evaluate)
        assert not drive(callback, args, state, clock, 0.5, **tools).should_training_stop
    assert drive(callback, args, state, clock, 0.5, **tools).should_training_stop and state.global_step == 101
    assert callback.plan.total == 101


@pytest.mark.parametrize(("margin_used", "whole"), [(0.4, True), (0.6, False)])
def test_a_stop_a_little_behind_the_plan_finishes_it_on_up_to_half_its_margin(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, margin_used: float, whole: bool
) -> None:
    """A stop whose window the deadline bounds (the plan was made to end by it): the plan's rest runs when it fits
    on up to half of the margin, as a late re-plan's decay may use (the stop's own save put the run behind its
    plan: CI's failure); a run further behind ends short, decayed, as a stopped run."""
    clock, handoff, stopper, callback, args, state, tools = planned_with_a_stopper(
        tmp_path, monkeypatch, (120, "2m"), 270
    )
    at = state.global_step
    stopper.received, stopper.received_at, stopper.stopped = signal.SIGTERM, clock.now, True
    clock.now += 1.0  # the stop's save: the final write is then 2/3 s
    # The plan made earlier (a faster start than these 0.5 s steps) left ``1 - margin_used`` of the margin now.
    margin = callback.plan.margin_s
    total = at + math.floor((handoff.deadline - clock.now - 2 / 3 - (1 - margin_used) * margin) / 0.5)
    callback.plan.total = state.max_steps = total
    callback.on_save(args, state, TrainerControl(should_training_stop=True), **tools)
    cut = callback.cut
    assert cut is not None and cut.whole_plan is whole, cut
    assert (cut.at_step + cut.steps == total) is whole and callback.plan.total <= total
    said = capsys.readouterr().err
    assert ("the plan's" in said and "steps left fit: finishing" in said) is whole, said


def test_a_re_plan_with_no_room_for_its_decay_decays_from_the_rate_it_finds(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """An evaluation far slower than estimated, late in a warmup_stable_decay run (a loaded machine), leaves no time
    for another step: the rate decays from the stable rate over what half the margin holds, instead of the run
    ending at its peak; no re-plan undoes it. A re-plan that leaves steps is no such case (late_decay: None)."""
    clock = Clock()
    monkeypatch.setattr(budget_module, "time", clock)
    callback = TimeBudget(budget_handoff(clock.now, 200, "200s"), eval_batches=3, checkpoint_mb=20.0)
    args = arguments(
        tmp_path, max_steps=10_000, warmup_steps=0, learning_rate=1.0, lr_scheduler_type="warmup_stable_decay",
        lr_scheduler_kwargs={"decay_type": "1-sqrt"}, eval_strategy="steps", eval_steps=50,
    )  # fmt: skip
    state = TrainerState()
    state.max_steps, state.eval_steps, state.save_steps = 10_000, 50, 500
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = get_scheduler(
        "warmup_stable_decay", optimizer=optimizer, num_warmup_steps=0, num_training_steps=10_000,
        scheduler_specific_kwargs={"num_decay_steps": 2000, "decay_type": "1-sqrt"},
    )  # fmt: skip
    tools = first_plan(callback, args, state, clock, scheduler)
    first = callback.plan.total
    # a plan a few steps shorter, its decay's start now just behind the current step: the schedule is rebuilt
    assert late_decay("warmup_stable_decay", args, (380, 305, 10_000), 0.2, room=10) is None
    assert first is not None and first > 300
    while state.global_step < 100:  # 100 steps in, on plan
        drive(callback, args, state, clock, 0.5, **tools)
    clock.now += 130  # the evaluation took 130 s: no time is left for the rest of the plan
    callback.on_evaluate(args, state, TrainerControl())
    control = drive(callback, args, state, clock, 0.5, **tools)
    plan = callback.plan
    assert not control.should_training_stop and plan.late_decay
    assert plan.total == 101 + 10 and plan.plans[-1]["decay_steps"] == 10  # the margin's half: 5 s of 0.5 s steps
    rates = [scheduler.lr_lambdas[0](step) for step in range(101, 112)]  # what steps 102..112 would train at
    assert rates[0] == 1.0 and rates[-1] == 0.0 and rates == sorted(rates, reverse=True)
    assert rates[-2] == pytest.approx(1 - math.sqrt(9 / 10))  # the last step's rate, as a plan's own decay ends
    assert plan.plans[-1]["decay_from_lr"] == 1.0  # the stable rate it had
    assert (
        "no time is left for another step, so the learning rate decays from its rate now over 10 more steps, to "
        "step 111" in capsys.readouterr().err
    )
    callback.on_save(args, state, TrainerControl())
    drive(callback, args, state, clock, 5.0, **tools)  # slower still: the decay stays as it is
    assert plan.total == 111 and len(plan.plans) == 2


def test_no_periodic_evaluation_a_few_steps_before_the_final_one(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An evaluation due within half an interval of the plan's last step is left to the final one (the run
    evaluates there anyway); one further away stays."""
    monkeypatch.setattr(budget_module, "time", Clock())  # steps that take no time: no plan is made here
    callback = TimeBudget(budget_handoff(1_000.0, 200, "200s"), eval_batches=3, checkpoint_mb=20.0)
    args = arguments(tmp_path, max_steps=10_000, eval_strategy="steps", eval_steps=10)
    state = TrainerState()
    state.max_steps, state.eval_steps = 10_000, 10
    callback.plan.total, callback.planned_at = 84, 70  # planned at step 70: none on the steps' pace before 90
    for step, kept in ((70, True), (80, False), (84, True)):  # 84: the last step's own evaluation
        state.global_step = step
        control = TrainerControl(should_evaluate=True)
        callback.on_step_end(args, state, control)
        assert control.should_evaluate is kept, step
    # Evaluated each epoch (of 20 steps here): the interval is the epoch's, not eval_steps' (which was 10).
    args = arguments(tmp_path, max_steps=-1, num_train_epochs=5, eval_strategy="epoch", eval_steps=10)
    callback.per_epoch = 20
    for step, kept in ((60, True), (76, False)):
        state.global_step = step
        control = TrainerControl(should_evaluate=True)
        callback.on_step_end(args, state, control)
        assert control.should_evaluate is kept, step


def test_a_plan_of_few_steps_says_it_is_of_little_use_and_what_to_change(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    clock = Clock()
    monkeypatch.setattr(budget_module, "time", clock)
    callback = TimeBudget(budget_handoff(clock.now, 30, "30s"), eval_batches=3, checkpoint_mb=20.0)
    args = arguments(tmp_path, max_steps=10_000, warmup_steps=2, eval_strategy="steps", eval_steps=50)
    state = TrainerState()
    state.max_steps, state.eval_steps, state.save_steps = 10_000, 50, 500
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=2, num_training_steps=10_000)
    first_plan(callback, args, state, clock, scheduler)
    total = callback.plan.total
    assert total is not None and total < budget_module.FEW_STEPS
    said = capsys.readouterr().err
    assert f"only {total} steps fit before" in said and "give a longer MLM_TIME_BUDGET" in said


def test_a_stop_inside_an_evaluation_records_no_window(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job saves the step of a stop that came inside an evaluation itself, outside the Trainer's loop: no steps
    follow, so no stop window may be planned (on CI one was recorded, and final/ claimed 924 decayed steps that never
    ran)."""
    clock = Clock()
    monkeypatch.setattr(budget_module, "time", clock)
    stopper = StopOnSignal()
    callback = TimeBudget(budget_handoff(clock.now, 600, "10m"), eval_batches=3, checkpoint_mb=20.0, stopper=stopper)
    args = arguments(tmp_path, max_steps=10_000, warmup_steps=2)
    state = TrainerState()
    state.max_steps, state.eval_steps, state.save_steps = 10_000, 10, 10
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=2, num_training_steps=10_000)
    tools = first_plan(callback, args, state, clock, scheduler)
    stopper.stopped = stopper.interrupted_evaluation = True  # as train/run/job.py's except branch has it
    callback.on_save(args, state, TrainerControl(), **tools)
    assert callback.cut is None and not stopper.finishing
    stopper.interrupted_evaluation = False  # a stop between steps: the window is planned
    callback.on_save(args, state, TrainerControl(), **tools)
    assert callback.cut is not None and stopper.finishing


def test_slow_steps_are_timed_from_the_first_and_planned_from_at_once_then_again(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A 3-minute budget on a base-size model on CPU: 30 s steps. Two untimed steps and three timed ones would
    spend 150 s before any plan; a step over 2 % of the budget is the pace already."""
    clock = Clock()
    monkeypatch.setattr(budget_module, "time", clock)
    callback = TimeBudget(budget_handoff(clock.now, 180, "3m"), eval_batches=0, checkpoint_mb=20.0)
    args = arguments(tmp_path, max_steps=10_000)
    state, tools = begun(callback, args, warmup=0)
    drive(callback, args, state, clock, 30.0, **tools)
    assert callback.step_times == [30.0] and callback.plan.total is not None  # planned after the first step
    first = callback.plan.total
    assert first < 1 + 150 / 30  # what fits the 150 s left before the margin, at 30 s a step
    drive(callback, args, state, clock, 20.0, **tools)
    drive(callback, args, state, clock, 20.0, **tools)  # the third timed step: planned again, on all three
    assert len(callback.plan.plans) == 2 and callback.plan.plans[1]["at_step"] == 3
    assert callback.plan.plans[1]["step_s"] == pytest.approx(70 / 3, abs=1e-3)
    assert "time budget: planned at step 1:" in capsys.readouterr().err


def test_under_a_batch_warm_up_steps_are_timed_and_planned_as_full_ones(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ramp's small steps are cheap: each is timed as its time over its share of the rows, and the plan counts
    each planned step at its share, so more steps fit than full ones would, and no more than their cost allows."""
    from train.common.schedules import BatchWarmup

    warmup = BatchWarmup(full=16, start=0.25, ratio=0.5, unit=1)
    costs = Costs(step=1.0, evaluation=0.0, evaluate_every=math.inf, save=0.0, save_every=math.inf, final=0.0)
    fit = steps_that_fit(now=0, deadline=100, costs=costs, margin=0, at=0, warmup=warmup)
    assert fit > 100 and warmup.full_steps(0, fit) <= 100 < warmup.full_steps(0, fit + 1), fit
    assert steps_that_fit(0, 100, costs, 0, at=0, warmup=None) == 100

    clock = Clock()
    monkeypatch.setattr(budget_module, "time", clock)
    callback = TimeBudget(budget_handoff(clock.now, 400, "400s"), eval_batches=0, checkpoint_mb=0.0)
    callback.batch_warmup = warmup
    args = arguments(tmp_path, max_steps=10_000, warmup_steps=5)
    state, tools = begun(callback, args, warmup=5)
    for _ in range(WARMUP_STEPS + 3):  # at a quarter of the rows, a quarter of a full step's 2 s
        drive(callback, args, state, clock, 0.5, **tools)
    assert callback.step_times == [pytest.approx(2.0)] * 3
    total = callback.plan.total
    assert total is not None and state.max_steps == total
    left = 400 - (clock.now - 1_000) - margin_for(400)
    assert 2.0 * warmup.full_steps(5, total) <= left < 2.0 * warmup.full_steps(5, total + 1)


def begun(callback: TimeBudget, args: Any, warmup: int, steps: int = 10_000) -> tuple[TrainerState, dict[str, Any]]:
    """A run of ``steps`` begun under ``callback`` with a linear schedule: its state and the tools it is driven with."""
    state = TrainerState()
    state.max_steps = steps
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=warmup, num_training_steps=steps)
    tools = {"lr_scheduler": scheduler, "optimizer": optimizer}
    callback.on_train_begin(args, state, TrainerControl(), **tools)
    return state, tools
