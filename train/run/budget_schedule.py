"""The learning-rate schedule of a time budget's plan (train/run/budget.py): the Trainer's own scheduler, its
functions rebuilt for a plan's steps, its decay still ahead at a step, and a decay from the rate of a given step (a
stop's window, or a re-plan that would otherwise have begun its decay in the past).

transformers builds a schedule for a number of steps fixed before training; nothing in it re-plans one."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from transformers import get_wsd_schedule

from train.borrowed.torch_optim import lr_functions, replace_lr_functions
from train.common import distributed
from train.common.console import warn
from train.common.schedules import WSD, scheduler_kwargs
from train.run.trainer import lr_scheduler_for, step_schedule

WARMUP_SHARE = 10  # a warm-up longer than half the plan becomes a tenth of it
CONSTANT = ("constant", "constant_with_warmup", "inverse_sqrt", "reduce_lr_on_plateau")  # schedules with no decay


def step_functions(scheduler: Any) -> list[Callable[[int], float]]:
    """The learning-rate functions of a step schedule: every scheduler here is a LambdaLR (``step_schedule``'s
    check, transformers' ``get_wsd_schedule`` and the Trainer's own), so one without them is a broken promise."""
    functions = lr_functions(scheduler)
    if functions is None:
        raise TypeError(f"{type(scheduler).__name__} is not a step schedule: it has no learning-rate functions")
    return functions


def warmup_for(total: int, args: Any) -> int:
    """The warm-up of a ``total``-step plan: the configured one, unless it would take more than half the plan
    (a warm-up set for a longer run), then a tenth of it, so that the run still decays."""
    configured = args.get_warmup_steps(total)
    return configured if configured <= total // 2 else total // WARMUP_SHARE


def schedule_for(total: int, args: Any, scheduler: Any, optimizer: Any, decay_ratio: float) -> int | None:
    """The Trainer's scheduler made to end at step ``total``: its learning-rate functions replaced by those of the
    same kind of schedule built for ``total`` steps (on a stand-in optimizer with as many groups: building one
    sets its optimizer's rates to the schedule's first), the real optimizer's rate for the step ahead set from them
    at once. Returns the warm-up steps, None where the schedule
    is not a function of the step (reduce_lr_on_plateau) and cannot follow the plan."""
    inner = step_schedule(scheduler)
    if inner is None or optimizer is None:
        if distributed.is_world_zero():
            warn(f"time budget: lr_scheduler_type {args.lr_scheduler_type} does not follow the planned steps")
        return None
    groups = len(inner.optimizer.param_groups)
    stand_in = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)]} for _ in range(groups)], lr=1.0)
    warmup = warmup_for(total, args)
    rebuilt = lr_scheduler_for(args, total, warmup, stand_in, decay_ratio)
    replace_lr_functions(inner, step_functions(rebuilt))
    return warmup


def decay_ahead(kind: str, args: Any, total: int, at: int, decay_ratio: float) -> int:
    """The steps of the ``total``-step plan's decay still ahead at step ``at``: warmup_stable_decay's decay phase,
    or every step left for a schedule that decays all along (linear, cosine, polynomial)."""
    left = total - at
    if kind != WSD:
        return left
    warmup = warmup_for(total, args)
    kwargs = scheduler_kwargs(kind, args.lr_scheduler_kwargs or {}, total, warmup, decay_ratio)
    decay = kwargs.get("num_decay_steps")
    if decay is None:  # the stable phase was given instead
        decay = total - warmup - int(kwargs["num_stable_steps"])
    return min(left, max(int(decay), 0))


def decay_after(scheduler: Any, at: int, stable: int, decay: int, kind: str, kwargs: dict[str, Any]) -> None:
    """The scheduler's learning rate from step ``at`` on: the rate of that step for ``stable`` more steps, then
    down to the schedule's floor over ``decay`` (warmup_stable_decay's decay shape and floor; linearly to zero for
    the others), through transformers' own WSD function on a stand-in optimizer."""
    wsd = kind == WSD
    floor = float(kwargs.get("min_lr_ratio", 0.0)) if wsd else 0.0
    shape_kwargs = {"decay_type": kwargs.get("decay_type", "cosine"), "num_cycles": kwargs.get("num_cycles", 0.5)}
    stand_in = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    shape = step_functions(
        get_wsd_schedule(
            stand_in, 0, decay, num_stable_steps=stable, **(shape_kwargs if wsd else {"decay_type": "linear"})
        )
    )[0]
    replace_lr_functions(
        scheduler,
        [
            functools.partial(_from_stop, at=at, level=old(at), floor=floor, shape=shape)
            for old in step_functions(scheduler)
        ],
    )


def _from_stop(step: int, *, at: int, level: float, floor: float, shape: Any) -> float:
    return floor + (level - floor) * shape(step - at) if level > floor else level


def late_decay(kind: str, args: Any, steps: tuple[int, int, int], decay_ratio: float, room: int) -> int | None:
    """A re-plan that leaves no step after the current one (an evaluation or a save far slower than measured: a
    loaded machine): the steps to decay over from here, or None when the plan has steps left (the schedule rebuilt
    for it then ends decayed at its last step). ``steps``: the new plan's total, the current step, the steps the
    options allow.

    With no step left the run would end at the rate it has now, never decayed (the stable rate of warmup_stable_decay).
    Instead the rate decays from where it is over the decay's share of the plan or ``room`` steps (half the margin at
    the measured step time), whichever is fewer; at least one step, never past what the options allow. (A re-plan
    that only moves the decay's start by a few steps, as plans do from one evaluation to the next, is not one.)"""
    total, at, cap = steps
    if kind in CONSTANT or total > at:
        return None
    share = decay_ahead(kind, args, total, 0, decay_ratio)
    steps_left = min(max(min(share, room), 1), cap - at)
    return steps_left if steps_left > 0 else None
