"""The learning-rate schedule a run followed, warmup included, rebuilt from run.json's options by transformers' own
scheduler, and kept only when it agrees with every logged learning rate.

The Trainer logs every ``logging_steps`` steps, so a warmup shorter than that leaves no trace in the log; the
schedule shows it. A schedule the log does not confirm is not drawn: the chart says why instead.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from train.borrowed.torch_optim import lr_functions
from train.common.errors import first_line
from train.common.schedules import scheduler_kwargs
from train.report.runlog import RunLog, number

# Steps drawn: every one of the first DENSE_STEPS (a warmup's ramp), then SAMPLES evenly spread over the run.
DENSE_STEPS = 200
SAMPLES = 1000


@dataclass
class Schedule:
    """The learning rate of each optimizer step, as transformers' scheduler computes it from run.json's options."""

    kind: str
    warmup_steps: int
    max_steps: int
    steps: list[int]
    rates: list[float]


def warmup_steps(config: dict[str, Any], max_steps: int) -> int:
    """TrainingArguments.get_warmup_steps: warmup_steps >= 1 is a count, below 1 a fraction of the steps; run.json
    from transformers 4 may carry warmup_ratio instead."""
    steps = number(config.get("warmup_steps")) or 0.0
    if steps >= 1:
        return int(steps)
    if steps > 0:
        return math.ceil(max_steps * steps)
    ratio = number(config.get("warmup_ratio")) or 0.0
    return math.ceil(max_steps * ratio) if ratio > 0 else 0


def schedule_factor(kind: str, warmup: int, max_steps: int, kwargs: dict[str, Any]) -> Callable[[int], float]:
    """transformers' own multiplier of the learning rate at each scheduler step (the Trainer builds it the same way,
    with get_scheduler). Raises when it cannot be built here (an unknown type, a schedule that is not a function of
    the step such as reduce_lr_on_plateau, no torch)."""
    import torch  # imported here: reading a run's logs needs neither torch nor transformers
    from transformers.optimization import get_scheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = get_scheduler(
        kind,
        optimizer=optimizer,
        num_warmup_steps=warmup,
        num_training_steps=max_steps,
        scheduler_specific_kwargs=dict(kwargs),
    )
    lambdas = lr_functions(scheduler)
    if not lambdas:
        raise TypeError(f"{type(scheduler).__name__} is not a function of the step")
    return lambdas[0]


def _max_steps(log: RunLog) -> int | None:
    """The run's planned length, from its latest record that says."""
    return next(
        (r["max_steps"] for r in reversed(log.banners + log.train) if isinstance(r.get("max_steps"), int)), None
    )


def _scheduler_kwargs(config: dict[str, Any]) -> dict[str, Any] | None:
    """lr_scheduler_kwargs as a dictionary (run.json may carry it as the JSON string it was given as); None when
    it is not one."""
    kwargs = config.get("lr_scheduler_kwargs") or {}
    if isinstance(kwargs, str):
        try:
            kwargs = json.loads(kwargs)
        except json.JSONDecodeError:
            return None
    return kwargs if isinstance(kwargs, dict) else None


def _failure(exc: Exception) -> str:
    return f"{type(exc).__name__}: {first_line(exc)}"


def lr_schedule(log: RunLog) -> tuple[Schedule | None, str]:
    """The schedule the logged learning rates follow, with the warmup the logs may not show (the first log is at
    step ``logging_steps``), or None and why it is not drawn. It is computed from run.json's options and kept only
    when it agrees with every logged learning rate: transformers 5 logs at step s the rate step s ran with (the
    scheduler's value after s - 1 steps), transformers 4 the one after s steps, and either is accepted."""
    config = (log.run or {}).get("config") or {}
    if not config:
        return None, "Schedule and warmup not drawn: no run.json (the run was interrupted or is still running)."
    if (log.run or {}).get("time_budget"):
        return None, (
            "Schedule not drawn: the time budget rebuilt it at each plan for the steps that fit (run.json's "
            "time_budget); the logged rates follow it."
        )
    base = number(config.get("learning_rate"))
    kind = config.get("lr_scheduler_type")
    max_steps = _max_steps(log)
    if base is None or not isinstance(kind, str) or not max_steps or max_steps < 1:
        return None, "Schedule not drawn: run.json or the logs lack learning_rate, lr_scheduler_type or max_steps."
    kwargs = _scheduler_kwargs(config)
    if kwargs is None:
        return None, "Schedule not drawn: run.json's lr_scheduler_kwargs is not a dictionary."
    warmup = warmup_steps(config, max_steps)
    ratio = number(config.get("decay_ratio"))
    if ratio is not None:  # warmup_stable_decay's decay as the job computed it (a run.json from before has none)
        kwargs = scheduler_kwargs(kind, kwargs, max_steps, warmup, ratio)
    try:
        factor = schedule_factor(kind, warmup, max_steps, kwargs)
    except Exception as exc:  # any failure only means the chart shows the logged rates alone
        return None, f"Schedule not drawn: transformers cannot compute {kind!r} here ({_failure(exc)})."
    logged = [
        (int(r["step"]), rate)
        for r in log.train
        if (rate := number(r.get("learning_rate"))) is not None and math.isfinite(rate) and 1 <= r["step"] <= max_steps
    ]
    if not logged:
        return None, "Schedule not drawn: no logged learning rate to check it against."

    def disagreement(offset: int) -> tuple[int, float, float] | None:
        """The first logged step whose rate is not the schedule's after ``step - offset`` scheduler steps."""
        for step, rate in logged:
            expected = base * factor(step - offset)
            if not math.isclose(expected, rate, rel_tol=1e-4, abs_tol=base * 1e-7):
                return step, expected, rate
        return None

    try:
        wrong = disagreement(1)  # transformers 5: step s is logged with the rate it ran with
        offset = 1 if wrong is None or disagreement(0) is not None else 0  # transformers 4: the next step's
    except Exception as exc:  # the function may fail on a step: the chart then shows the logged rates alone
        return None, f"Schedule not drawn: transformers' {kind!r} failed here ({_failure(exc)})."
    if offset == 1 and wrong is not None:
        step, expected, rate = wrong
        return None, (
            f"Schedule not drawn: run.json's {kind} schedule (learning rate {base:g}, warmup {warmup} steps) gives "
            f"{expected:.6g} at step {step}, the log {rate:.6g}."
        )
    shown = {1, max_steps, *range(1, min(max_steps, DENSE_STEPS) + 1), warmup, warmup + 1, warmup + 2}
    shown |= {1 + round(i * (max_steps - 1) / SAMPLES) for i in range(SAMPLES + 1)}
    steps = sorted(s for s in shown if 1 <= s <= max_steps)
    rates = [base * factor(s - offset) for s in steps]
    return Schedule(kind, warmup, max_steps, steps, rates), (
        f"Dashed: the {kind} schedule from run.json (learning rate {base:g}, warmup {warmup} steps, {max_steps} "
        f"steps in all), computed by transformers; it agrees with all {len(logged)} logged learning rates."
    )
