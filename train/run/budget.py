"""The time budget on the ranks: how many steps fit before the deadline the launcher handed over
(train/launch/deadline.py), planned from measured times, with the learning-rate schedule made to end there.

The rule, stated once (its arithmetic, and the constants it names but for the timing's, in
train/run/budget_costs.py):
- The first ``WARMUP_STEPS`` steps of a session are not timed (allocator growth, loader start, first kernels);
  after ``TIMED_STEPS`` more, the first plan is made; every evaluation and save is timed as it happens, and the
  plan is made again after each, with what they cost. A step longer than ``SLOW_STEP_SHARE`` of the budget is
  timed whatever its place and the plan made at once (a 3-minute budget's 30 s steps: five steps to time ate it),
  then again once ``TIMED_STEPS`` are timed.
- ``PACE_STEPS`` steps after a plan it is made again from the steps' pace, and taken only when its last step
  comes sooner by more than ``PACE_LATE`` of the steps left, or later by more than ``PACE_EARLY`` of them
  (train/run/budget_costs.py ``pace_moves``): a run whose steps slow down ends by its deadline, one whose steps sped
  up uses the time, and small moves leave the schedule alone. Every rank decides at the same step on the figures
  all agreed (below), so all take it or none.
- A step costs the larger of two means of its measured times, over the last ``STEP_WINDOW`` steps and over the
  last ``LONG_WINDOW``: a slowdown counts at once, a speed-up once it lasts (with the short mean alone, beside two
  busy loops, it swung from 0.07 to 0.63 s, and re-plans moved a 150 s budget's plan between 234 and 1,036 steps).
  Means, not medians: on a machine shared with other work, a step that waited for the CPU costs wall time as any
  other (the median of a loaded run's steps was a third of their mean, and plans ran past their deadline); each
  step counted at most ``STALL_CAP`` times the median (one stall, a page-cache miss or a paused process, is not
  the run's pace). To it is added its share of the evaluations and saves to come: each one's measured time; until
  an evaluation happens, its batches times a batch measured at the first plan through the path an evaluation takes
  (train/run/budget_evaluation.py: the median of a few, after one to warm up); until a save happens, the
  checkpoint's size at ``ESTIMATED_WRITE_MB_S``. An evaluation's cost is not scaled by the steps' pace: beside two
  busy loops the steps slowed 5-fold and an evaluation 2-fold (threads waiting for each other on busy cores); a
  final evaluation so planned at 75 s took 31 s (the run ended after 97 s of its 150 s), another, scaled down with
  faster steps, planned at 1.4 s took 7.2 s.
- Under a batch warm-up (train/common/schedules.py BatchWarmup) every measure and plan is in full steps: a step's
  time is divided by its share of the full batch's rows, and the steps planned cost their shares; the ramp, the
  learning rate's schedule and the plan count the same optimizer steps, so the decay still ends at the last one.
- Before the deadline stay the final evaluation, the final model's write, the publishing and a margin of
  ``MARGIN_FRACTION`` of the budget (at least ``MIN_MARGIN_S``).
- The plan only shortens the run the other options set (max_steps, epochs, a resumed run's earlier plan); every
  rank computes one and all take the smallest, so that they stop at the same step.
- The schedule: the Trainer's own scheduler, its learning-rate function rebuilt for the planned steps at each
  plan (warm-up, then the decay ending at the last planned step), so a budgeted run ends decayed as a run of that
  many steps would; a warm-up longer than half the plan becomes a tenth of it. The Trainer stops at
  ``state.max_steps``, which the plan sets.
- A stop signal (train/run/preemption.py) is the deadline come early. Once the stop's checkpoint is saved (what a
  rerun resumes: the schedule as planned), the run goes on for the steps that fit before torchrun's stop timeout
  (``stop_timeout`` from the signal, or the deadline when it is sooner) with the final evaluation and model and a
  margin of the same rule, and the learning rate decays to zero over the last of them: over as many as the plan's
  decay had ahead of it, at most; the steps before stay at the rate of the stop. No checkpoint is saved nor any
  evaluation made in them. When the plan's own remaining steps fit, the run just finishes as planned. A stop
  before the first plan, or inside an evaluation, stops at once as in any run.

transformers plans by steps or epochs only; nothing in it or accelerate reads a wall-clock limit.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from train.common import distributed, durations
from train.common.console import say, warn
from train.common.handoff import Handoff
from train.common.schedules import BatchWarmup
from train.run.budget_costs import LONG_WINDOW, PACE_STEPS, Costs, margin_for, pace_moves, step_cost, steps_that_fit
from train.run.budget_schedule import CONSTANT, decay_after, decay_ahead, late_decay, schedule_for
from train.run.budget_stop import CutShort, steps_after_stop
from train.run.preemption import StopOnSignal
from train.run.trainer import schedule_kind, step_schedule

WARMUP_STEPS = 2
TIMED_STEPS = 3
ESTIMATED_WRITE_MB_S = 200.0  # a local disk, until a save has been timed
FEW_STEPS = 50  # a plan of fewer steps is said to be of little use (a 3-minute budget planned 5)
SLOW_STEP_SHARE = 0.02  # a step taking this share of the budget is timed, warm-up or not, and planned from at once


@dataclass
class BudgetPlan:
    """The plans made so far, as the banner's follow-up lines and run.json show them."""

    deadline: float
    source: str
    budget_s: float
    margin_s: float
    cap: int | None = None  # the steps the other options set (or a resumed run's earlier plan)
    late_decay: bool = False  # a re-plan's decay from the rate it found (:func:`late_decay`): the plan is final
    total: int | None = None  # the planned max_steps
    plans: list[dict[str, Any]] = field(default_factory=list)
    cut_short: CutShort | None = None  # a stop's steps to a final model

    def record(self) -> dict[str, Any]:
        return {
            "budget": durations.shown(self.budget_s),
            "source": self.source,
            "margin_s": round(self.margin_s, 1),
            "steps_set_by_options": self.cap,
            "planned_steps": self.total,
            "plans": self.plans,
            "cut_short": self.cut_short.record() if self.cut_short is not None else None,
        }


class TimeBudget(TrainerCallback):
    """Times the steps, evaluations and saves, and (re)plans ``state.max_steps`` and the schedule to the deadline."""

    def __init__(
        self,
        handoff: Handoff,
        eval_batches: int,
        checkpoint_mb: float,
        decay_ratio: float = 0.2,
        stopper: StopOnSignal | None = None,
        stop_timeout_s: float = 270.0,
    ) -> None:
        assert handoff.deadline is not None and handoff.budget_s is not None
        budget = handoff.budget_s
        self.plan = BudgetPlan(handoff.deadline, handoff.deadline_source, budget, margin_for(budget))
        self.eval_batches = eval_batches
        self.checkpoint_mb = checkpoint_mb
        self.decay_ratio = decay_ratio  # warmup_stable_decay's decay, a fraction of whatever the plan is
        self.resumed_total: int | None = None  # a resumed run's earlier plan (job.py sets it)
        self.step_times: list[float] = []
        self.evaluations: list[float] = []
        self.saves: list[float] = []
        self.mark = 0.0
        self.per_epoch = math.inf  # steps in an epoch, for epoch-wise evaluations and saves
        self.steps_this_session = 0
        self.replan = False
        self.planned_at = 0  # the step of the last plan, or of the last one made on the pace and not taken
        self.stopper = stopper
        self.stop_timeout_s = stop_timeout_s
        self.planned_early = False  # the first plan came before TIMED_STEPS steps were timed (slow steps)
        self.size_evaluation: Any = None  # measures an evaluation batch, cuts the held-out set (budget_evaluation.py)
        self.eval_batch_s = 0.0  # one evaluation batch as measured (0 before): the cost until an evaluation is timed
        self.batch_warmup: BatchWarmup | None = None  # a growing batch: steps timed and planned as full ones

    @property
    def cut(self) -> CutShort | None:
        """A stop's steps to the end, after its checkpoint (the plan keeps it for run.json)."""
        return self.plan.cut_short

    # The times: each event's duration runs from the previous event's end (a step's includes its data loading).
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.per_epoch = state.max_steps / args.num_train_epochs if args.max_steps <= 0 else math.inf
        self.plan.cap = min(state.max_steps, self.resumed_total or state.max_steps)
        if self.plan.cap < state.max_steps:  # resumed: the earlier plan's schedule until this session's first plan
            state.max_steps = self.plan.cap
            schedule_for(self.plan.cap, args, kwargs.get("lr_scheduler"), kwargs.get("optimizer"), self.decay_ratio)
        self.mark = time.monotonic()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.evaluations.append(self._since_mark())
        self.replan = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.saves.append(self._since_mark())
        self.replan = True
        stopper = self.stopper
        if (
            stopper is not None
            and stopper.stopped
            and not stopper.interrupted_evaluation
            and self.cut is None
            and (self.plan.total is not None)
        ):
            self._cut_short(args, state, control, kwargs.get("lr_scheduler"), kwargs.get("optimizer"))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        took = self._since_mark()
        self.steps_this_session += 1
        slow = took > SLOW_STEP_SHARE * self.plan.budget_s  # the pace already: timed, and the plan made at once
        if self.steps_this_session > WARMUP_STEPS or slow:
            # Under a batch warm-up, a step's time as a full step's: its time over its share of the rows (the
            # batch's rows are most of a step's work; the rest, counted as rows too, makes the plan cautious).
            share = self.batch_warmup.share(state.global_step - 1, state.max_steps) if self.batch_warmup else 1.0
            self.step_times = [*self.step_times[1 - LONG_WINDOW :], took / share]  # the longer window's, no more
        timed = len(self.step_times)
        if timed == TIMED_STEPS and self.planned_early:
            self.replan = True  # planned on slow steps: again, once as many are timed as a plan usually has
        first = self.plan.total is None and (timed >= TIMED_STEPS or (slow and timed > 0))
        self.planned_early = self.planned_early or (first and timed < TIMED_STEPS)
        # The planned last step ends the run however much time is left: the Trainer's own flow callback, which runs
        # first, has stopped it there already, with the schedule decayed to its end (a re-plan at that step drew a
        # longer plan that was never trained, its last steps missing from run.json's account).
        reached = self.plan.total is not None and state.global_step >= self.plan.total
        again = self.plan.total is not None and not self.plan.late_decay
        paced = again and state.global_step - self.planned_at >= PACE_STEPS  # the same step on every rank
        if self.cut is None and not reached and (first or (again and self.replan) or paced):
            on_pace = not (first or self.replan)
            self.replan = False
            self._make_plan(args, state, kwargs.get("lr_scheduler"), kwargs.get("optimizer"), on_pace)
        if self.plan.total is not None and state.global_step >= self.plan.total:
            control.should_training_stop = True
        elif self.plan.total is not None and control.should_evaluate and self._final_evaluation_near(args, state):
            control.should_evaluate = False  # the final evaluation follows in a few steps: one evaluation, not two

    def _final_evaluation_near(self, args: Any, state: Any) -> bool:
        """Within half an evaluation interval of the plan's last step, whose evaluation the run makes anyway: an
        evaluation here would be a second one a few steps before it (a plan's end falls anywhere; two evaluations of
        20 s each at steps 80 and 81 were seen)."""
        assert self.plan.total is not None
        every = _every(args.eval_strategy, self.per_epoch, state.eval_steps)
        return math.isfinite(every) and self.plan.total - state.global_step < every / 2

    def _since_mark(self) -> float:
        now = time.monotonic()
        took, self.mark = now - self.mark, now
        return took

    def costs(self, args: Any, state: Any) -> Costs:
        """The measured times of what is left (a save's estimate until one is timed)."""
        step = step_cost(self.step_times)
        timed = self.evaluations[-1] if self.evaluations else self.eval_batches * self.eval_batch_s
        evaluation = timed if self._evaluates(args) else 0.0
        save = self.saves[-1] if self.saves else self.checkpoint_mb / ESTIMATED_WRITE_MB_S
        return Costs(
            step=step,
            evaluation=evaluation,
            evaluate_every=_every(args.eval_strategy, self.per_epoch, state.eval_steps),
            save=save,
            save_every=_every(args.save_strategy, self.per_epoch, state.save_steps),
            # the final weights are about a third of a checkpoint (no optimizer state): written, then published
            final=evaluation + 2 * save / 3,
        )

    def _evaluates(self, args: Any) -> bool:
        return args.eval_strategy != "no" and self.eval_batches > 0

    def _make_plan(self, args: Any, state: Any, scheduler: Any, optimizer: Any, on_pace: bool = False) -> None:
        """The plan made (again): ``on_pace``, one made only because ``PACE_STEPS`` have passed since the last, is
        taken when its end moved far enough (:func:`pace_moves`), decided on the figures every rank agreed."""
        first = self.plan.total is None and not self.evaluations
        measured = first and self.size_evaluation is not None and self._evaluates(args)
        if measured:  # on every rank: all plan at the same step, and under FSDP a forward is a collective
            self.eval_batches, self.eval_batch_s = self.size_evaluation(
                self.plan.budget_s, self.eval_batches, args.device
            )
            self.mark = time.monotonic()  # the measuring is no step's: the next step's time starts here
        costs = self.costs(args, state)
        fit = state.global_step + steps_that_fit(
            time.time(), self.plan.deadline, costs, self.plan.margin_s, state.global_step, self.batch_warmup
        )
        cap = self.plan.cap or fit
        total = agreed_minimum(max(min(fit, cap), state.global_step), args.device)
        before, at = self.plan.total, state.global_step
        self.planned_at = at
        if on_pace and before is not None and not pace_moves(before, total, at):
            return
        room = math.floor(self.plan.margin_s / 2 / costs.step) if costs.step > 0 else 0
        kind, inner, warmup = schedule_kind(args), step_schedule(scheduler), None
        late = None if before is None else late_decay(kind, args, (total, at, cap), self.decay_ratio, room)
        if late is not None and inner is not None and optimizer is not None:
            late = agreed_minimum(late, args.device)  # the room differs by rank: all take the fewest steps
            level = optimizer.param_groups[0]["lr"]  # the rate the decay starts from (the scheduler's at this step)
            total = at + late
            self.plan.late_decay = True  # no re-plan from here: one would rebuild the schedule, undoing the decay
            decay_after(inner, at, 0, late, kind, args.lr_scheduler_kwargs or {})
        self.plan.total = state.max_steps = total
        if not self.plan.late_decay:
            warmup = schedule_for(total, args, scheduler, optimizer, self.decay_ratio)
        self.plan.plans.append(
            {
                "at_step": at,
                **({"on_pace": True} if on_pace else {}),
                "planned_steps": total,
                "warmup_steps": warmup,
                "step_s": round(costs.step, 4),
                "evaluation_s": round(costs.evaluation, 2),
                **({"evaluation_batch_s": round(self.eval_batch_s, 4)} if measured else {}),
                "save_s": round(costs.save, 2),
                "final_s": round(costs.final, 2),
                **({"decay_steps": late, "decay_from_lr": level} if self.plan.late_decay else {}),
            }
        )
        if before == total or not distributed.is_world_zero():
            return
        if self.plan.late_decay:
            say(
                f"time budget: re-planned at step {at}: no time is left for another step, so the learning rate "
                f"decays from its rate now over {late} more steps, to step {total} "
                f"(a step {costs.step:.3g} s: up to half of the {self.plan.margin_s:.0f} s margin may be used)"
            )
            return
        ends = durations.utc_clock(self.plan.deadline)
        limited = "the time budget" if fit < cap else f"the {cap} steps the other options set (they fit)"
        limited += f" (the steps' pace moved the end from step {before})" if on_pace else ""
        again = "re-planned" if before is not None else "planned"
        configured = args.get_warmup_steps(total)
        cut = ""
        if warmup is not None and warmup != configured:
            cut = f"; warm-up {warmup} steps (the {configured} configured would leave no decay)"
        say(
            f"time budget: {again} at step {state.global_step}: {total} steps, set by {limited}{cut}; a step "
            f"{costs.step:.3g} s, an evaluation {costs.evaluation:.3g} s, a save {costs.save:.3g} s; the final "
            f"evaluation and save {costs.final:.3g} s and a margin of {self.plan.margin_s:.0f} s before {ends}"
        )
        if fit < cap and total < FEW_STEPS and (before is None or before >= FEW_STEPS):
            warn(
                f"time budget: only {total} steps fit before {ends}: a model trained that few steps is rarely of "
                f"use; give a longer MLM_TIME_BUDGET, or make a step cheaper (a smaller model, batch or "
                f"max_seq_length){' or the evaluation smaller (max_eval_samples)' if costs.final > costs.step else ''}"
            )

    def _cut_short(self, args: Any, state: Any, control: Any, scheduler: Any, optimizer: Any) -> None:
        """After the stop's checkpoint: the steps that fit the stop's window, decaying (the module's rule)."""
        assert self.stopper is not None and self.plan.total is not None
        kind, inner = schedule_kind(args), step_schedule(scheduler)
        if kind in CONSTANT or inner is None or optimizer is None:
            return
        received = self.stopper.received_at or time.time()
        end = min(self.plan.deadline, received + self.stop_timeout_s)
        costs = self.costs(args, state)
        quiet = dataclasses.replace(costs, evaluate_every=math.inf, save_every=math.inf)  # none of either
        at, total, now = state.global_step, self.plan.total, time.time()
        fit = steps_that_fit(now, end, quiet, margin_for(self.stop_timeout_s))
        if (
            fit < total - at
            and end >= self.plan.deadline
            and (steps_that_fit(now, end, quiet, self.plan.margin_s / 2) >= total - at)
        ):
            # The deadline bounds the window, and the plan was made to end by it: a run a little behind its plan
            # (the stop's own save, a slower step) finishes the plan on up to half of its margin, as a late re-plan
            # may, rather than end a few steps short as a stopped run.
            fit = total - at
        fit = agreed_minimum(fit, args.device)
        steps, decay = steps_after_stop(total - at, fit, decay_ahead(kind, args, total, at, self.decay_ratio))
        if steps < 1:
            return
        whole = steps == total - at
        self.plan.cut_short = CutShort(self.stopper.signal_name, at, steps, decay, whole, end - received)
        self.stopper.finishing = True
        control.should_training_stop = False
        if not whole:
            self.plan.total = state.max_steps = at + steps
            decay_after(inner, at, steps - decay, decay, kind, args.lr_scheduler_kwargs or {})
        self.plan.plans.append({"at_step": at, "planned_steps": at + steps, "after_a_stop": True})
        if distributed.is_world_zero():
            name = self.stopper.signal_name
            if whole:
                say(f"stopped by {name} at step {at}, checkpoint saved; the plan's {steps} steps left fit: finishing")
            else:
                say(
                    f"stopped by {name} at step {at}, its checkpoint saved (what a rerun resumes): {steps} more steps "
                    f"fit the {end - received:.0f} s the stop leaves (MLM_STOP_TIMEOUT, or the deadline), the learning "
                    f"rate decaying to zero over the last {decay}; then final/ is evaluated and written as a stopped "
                    "run's model"
                )


def _every(strategy: Any, per_epoch: float, steps: Any) -> float:
    """Steps between evaluations (or saves) under ``strategy``: inf when none come before the end."""
    name = str(getattr(strategy, "value", strategy))
    if name == "steps":
        return float(steps or 0) or math.inf
    if name == "epoch":
        return per_epoch
    return math.inf


def agreed_minimum(value: int, device: Any) -> int:
    """The smallest of every rank's ``value`` (the one value without a process group)."""
    if not distributed.initialized():
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())
