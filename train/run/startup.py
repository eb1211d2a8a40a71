"""Where a run's start-up goes, phase by phase, from the launch to its first step: the ``startup`` record of
logs/train.jsonl and its one line (world rank 0's; the other ranks wait for it in the same phases).

The phases, in the order a rank meets them: the launcher (from its start to this process's: its imports, the plan,
torchrun), this process's imports (to ``main``), the configuration, the checks before any data (the model's config,
a handed-over model's files), reading the data, the tokenizer (loaded, or trained), choosing and fetching the
checkpoint to resume from, tokenizing and packing (the cache hit or missed), the model (built or loaded, sharded),
the Trainer (its arguments, the collator, the facts the banner shows), from there to the Trainer's start of
training (callbacks, the run's record), and the first step (its checkpoint loaded, the data loader started, the
first batch, forward and backward). Nothing in transformers or torchrun reports these: the Trainer's own timings
begin at its first step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import psutil

STARTUP_EVENT = "startup"
FIRST_STEP = "first step"


@dataclass
class Startup:
    """The phases' durations in seconds, measured on this rank's wall clock, with a note where a phase can say more
    (a cache hit). :meth:`mark` ends the phase that ran since the previous mark."""

    process_at: float  # this process's start (the kernel's, wall clock)
    launched_at: float | None = None  # the launcher's start (MLM_LAUNCH), when a launcher started the run
    phases: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    last: float = 0.0

    @classmethod
    def begin(cls) -> Startup:
        """Called first thing in ``main``: what came before it was this process's imports."""
        started = psutil.Process().create_time()
        startup = cls(process_at=started, last=started)
        startup.mark("imports")
        return startup

    def mark(self, phase: str, note: str | None = None) -> None:
        """The phase that ran since the previous mark ends now (a phase met twice adds up)."""
        now = time.time()
        self.phases[phase] = self.phases.get(phase, 0.0) + max(now - self.last, 0.0)
        self.last = now
        if note:
            self.notes[phase] = note

    def record(self) -> dict[str, Any]:
        """The ``startup`` record, once the first step has been marked."""
        phases = dict(self.phases)
        if self.launched_at is not None:
            phases = {"launcher": max(self.process_at - self.launched_at, 0.0), **phases}
        since = self.launched_at if self.launched_at is not None else self.process_at
        return {
            "event": STARTUP_EVENT,
            "to_first_step_s": round(self.last - since, 2),
            "from": "launch" if self.launched_at is not None else "process start",
            "phases_s": {name: round(seconds, 2) for name, seconds in phases.items()},
            "notes": dict(self.notes),
        }


def startup_text(record: dict[str, Any]) -> str:
    """``start-up: the first step ended 8.6 s after launch: launcher 1.8 s, imports 3.9 s, ...`` (phases of
    under 0.05 s left out of the line; the record keeps them)."""
    notes = record.get("notes", {})
    parts = [
        f"{name} {seconds:.1f} s" + (f" ({notes[name]})" if name in notes else "")
        for name, seconds in record.get("phases_s", {}).items()
        if seconds >= 0.05 or name in notes
    ]
    return f"start-up: the first step ended {record['to_first_step_s']:.1f} s after {record['from']}: " + ", ".join(
        parts
    )
