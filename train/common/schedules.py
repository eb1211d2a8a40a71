"""The schedules' rules of our own: warmup_stable_decay's decay as a fraction of the steps, and the mask rate's
schedule (:func:`mask_rate`).

transformers' ``get_wsd_schedule`` takes the decay as a number of steps, which is unknown until training starts
(epochs over a corpus, a stream's max_steps, a time budget's plan): the Trainer's scheduler
(train/run/trainer.py), the time budget's re-plans (train/run/budget.py) and the report's drawn schedule
(train/report/schedule.py) all turn the ``decay_ratio`` option into it here. In common/ because the report reads
logs without importing the configuration's schema (which imports transformers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

WSD = "warmup_stable_decay"


def scheduler_kwargs(
    kind: str, kwargs: Mapping[str, Any], total: int, warmup: int, decay_ratio: float
) -> dict[str, Any]:
    """transformers' ``scheduler_specific_kwargs`` for a schedule of ``total`` steps: warmup_stable_decay gets
    ``num_decay_steps`` = ``decay_ratio`` of them (at least one, at most what the warm-up leaves) unless the
    kwargs give the decay or the stable phase themselves; any other schedule gets the kwargs as they are."""
    kwargs = dict(kwargs)
    if kind != WSD or "num_decay_steps" in kwargs or "num_stable_steps" in kwargs:
        return kwargs
    decay = min(max(1, math.ceil(total * decay_ratio)), max(total - warmup, 0))
    return {**kwargs, "num_decay_steps": decay}


def mask_rate(start: float, end: float | None, done: int, total: int) -> float:
    """The training mask rate of the step after ``done`` of ``total`` steps: linear from ``start`` at the first step
    towards ``end`` at the end (Ankner et al. 2023, "Dynamic Masking Rate Schedules for MLM Pretraining": 30 % ->
    15 %, linear, beat both constant rates); ``start`` all along when ``end`` is None. ``total`` is the run's
    planned steps as they stand (a time budget's re-plan moves them, and the rate follows)."""
    if end is None or total <= 0:
        return start
    return start + (end - start) * min(max(done, 0) / total, 1.0)
