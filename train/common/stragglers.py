"""Stragglers, the rule: which rank is slower than the others, from each rank's own time per step (what it spends
fetching its batches and in its forward passes, measured by train/run/stragglers.py), and how a named one is said
(the warning, run.json's ``stragglers``, the report and the trackers read :func:`straggler_words`).

Pure, without torch: the report and the trackers read run.json's record with it."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

# A rank is slow in a training record when its own time per step is at least this many times the others' median
# (a rank of two compares with the other alone); named once it has been slow this many records in a row. The
# session's first record is left out: it holds the loader's start and the first step's allocations. Measured here
# (2 gloo ranks, 2 CPU cores, the tiny model, a record every step): a healthy run's ranks within 1.33x of each other
# but for one record at an epoch's start (3.2x: one rank's loader starting again); slow@1:3 read 3.5x to 16x.
SLOW_RATIO = 1.5
SLOW_RECORDS = 3
RANK_STEP = "rank_step_s/"  # a training record's key for each rank's own time per step: rank_step_s/0, ...


@dataclass(frozen=True)
class Straggler:
    """A rank named: ``rank`` (world), at the record of ``step``, ``ratio``: its own time per step over the others'
    median then, ``seconds``: its own time per step, ``median_s``: the others' median."""

    rank: int
    step: int
    ratio: float
    seconds: float
    median_s: float

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, entry: Any) -> Straggler | None:
        """One of run.json's ``stragglers``, read as data: None where it is not one."""
        try:
            return cls(int(entry["rank"]), int(entry["step"]), float(entry["ratio"]), float(entry["seconds"]),
                       float(entry["median_s"]))  # fmt: skip
        except (KeyError, TypeError, ValueError):
            return None


def slow_ranks(seconds: Sequence[float]) -> dict[int, tuple[float, float]]:
    """The ranks slow in one record, each with its ratio to the others' median and that median; ``seconds``: every
    rank's own time per step, by world rank. None is slow where the others' median is 0 (nothing timed)."""
    slow: dict[int, tuple[float, float]] = {}
    for rank, own in enumerate(seconds):
        others = [s for r, s in enumerate(seconds) if r != rank]
        median = statistics.median(others) if others else 0.0
        if median > 0 and own / median >= SLOW_RATIO:
            slow[rank] = (round(own / median, 2), round(median, 4))
    return slow


def straggler_line(straggler: Straggler) -> str:
    """The warning said once a rank is named."""
    return (
        f"straggler: rank {straggler.rank} spent {straggler.ratio:.1f}x the others' median on its own work per step "
        f"(its batches and forward passes: {straggler.seconds:.3f} s against {straggler.median_s:.3f} s) over the "
        f"last {SLOW_RECORDS} records, up to step {straggler.step}; every step waits for it: check its node (the "
        f"GPU's clocks and temperature, its data loader, other processes on it)"
    )


def straggler_words(entries: Any) -> str | None:
    """run.json's ``stragglers`` in words, for the report and the trackers: "none", or each rank named with the
    step and ratio; None where the run did not look (one rank) or the record does not read."""
    if not isinstance(entries, list):
        return None
    named = [s for s in (Straggler.of(e) for e in entries) if s is not None]
    if not named:
        return "none"
    return ", ".join(f"rank {s.rank} (from step {s.step}: {s.ratio:.1f}x the others' median)" for s in named)
