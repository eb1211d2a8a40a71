"""The schedules' rules of our own: warmup_stable_decay's decay as a fraction of the steps, the mask rate's
schedule (:func:`mask_rate`) and the batch's warm-up (:class:`BatchWarmup`).

transformers' ``get_wsd_schedule`` takes the decay as a number of steps, which is unknown until training starts
(epochs over a corpus, a stream's max_steps, a time budget's plan): the Trainer's scheduler
(train/run/trainer.py), the time budget's re-plans (train/run/budget.py) and the report's drawn schedule
(train/report/schedule.py) all turn the ``decay_ratio`` option into it here. In common/ because the report reads
logs without importing the configuration's schema (which imports transformers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class BatchWarmup:
    """A global batch that grows during training (the batch_warmup_ratio and batch_warmup_start options): linear
    from ``start`` of the ``full`` batch, in rows, at the first step to all of it once ``ratio`` of the planned steps
    are done (Cramming ramps over 60 % of its budget; ModernBERT's batch size warm-up). Rows are tokens for packed
    blocks, each ``max_seq_length`` long. ``unit``: the ranks times the micro-batches of a step (each trains a row
    at least). The learning-rate schedule, the mask rate and the time budget all count the same optimizer steps, so
    the decay ends at the planned last step whatever the ramp; ``total`` is the planned steps as they stand (a time
    budget's re-plan moves the ramp's end, as it moves the decay's), and the step is the Trainer's, saved with each
    checkpoint: a resumed run goes on with the ramp where it was."""

    full: int
    start: float
    ratio: float
    unit: int

    def rows(self, done: int, total: int) -> int:
        """The global batch of the step after ``done`` of ``total`` steps: a multiple of ``unit``, never under it
        nor over ``full``."""
        ramp = self.ratio * total
        if self.ratio <= 0 or total <= 0 or done >= ramp:
            return self.full
        rows = self.full * (self.start + (1.0 - self.start) * max(done, 0) / ramp)
        return min(max(round(rows / self.unit) * self.unit, self.unit), self.full)

    def share(self, done: int, total: int) -> float:
        """The step's rows as a share of the full batch's: what it costs against a full step (the time budget's
        unit)."""
        return self.rows(done, total) / self.full

    def ramp_steps(self, total: int) -> int:
        """The steps the ramp lasts in a plan of ``total`` steps."""
        return min(math.ceil(self.ratio * total), total) if total > 0 else 0

    def full_steps(self, done: int, total: int) -> float:
        """The steps after ``done`` of a plan of ``total`` counted in full steps, each its share of the full batch:
        what they cost against full steps (the time budget plans with it). The ramp taken as linear, its rounding
        to ``unit`` left out, its floor at ``unit`` kept: an estimate as good as a measured step time."""
        done = max(done, 0)
        if total <= done:
            return 0.0
        ramp = self.ratio * total
        if self.ratio <= 0 or done >= ramp:
            return float(total - done)
        floor, slope = self.unit / self.full, (1.0 - self.start) / ramp
        rising = ramp * (floor - self.start) / (1.0 - self.start) if self.start < floor else 0.0  # at the floor before
        end = self.ramp_steps(total)  # the first full step
        flat = min(max(math.ceil(rising) - done, 0), end - done)
        first = done + flat
        linear = (end - first) * self.start + slope * (end - first) * (first + end - 1) / 2
        return flat * floor + linear + (total - end)

    def record(self, max_seq_length: int | None = None) -> dict[str, Any]:
        """run.json's and the banner record's ``batch_warmup``: the first step's rows and the full batch's, the
        share of the steps it grows over; with ``max_seq_length`` (packed blocks) the same in tokens."""
        first = self.rows(0, 1 << 30)
        record: dict[str, Any] = {"first_rows": first, "full_rows": self.full, "ratio": self.ratio}
        if max_seq_length:
            record.update(first_tokens=first * max_seq_length, full_tokens=self.full * max_seq_length)
        return record

    def micro_batch_rows(self, done: int, total: int, world: int, micro_batches: int) -> list[int]:
        """One rank's rows in each of a step's ``micro_batches``: the step's global rows shared out evenly."""
        rows = self.rows(done, total) // world
        return [rows // micro_batches + (1 if i < rows % micro_batches else 0) for i in range(micro_batches)]


def full_steps_between(warmup: BatchWarmup | None, start: int, end: int, total: int) -> float:
    """The steps after ``start`` up to ``end`` of a plan of ``total`` counted in full steps (the time budget's unit):
    each its share of the full batch under a batch ``warmup``, one each without. The log's ETA divides the time the
    steps done took by their cost in it, so a ramp's cheap first steps do not make the full ones still to come look
    cheap."""
    if warmup is None:
        return float(max(end - start, 0))
    return warmup.full_steps(start, total) - warmup.full_steps(max(end, start), total)
