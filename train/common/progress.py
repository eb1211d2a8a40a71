"""What a rank last did, as the launcher's hang watchdog reads it (train/launch/watchdog.py), and the watchdog's
rules: when a node counts as hung, and which ranks to name.

Each rank of a launch rewrites ``progress-rank-N.json`` in the launch's exit directory (``MLM_EXIT_DIR``, on the
node's own disk) at every event of progress (train/run/progress.py), and registers Python's faulthandler to write
its stack to ``stacks-rank-N.txt`` there on SIGQUIT. A file, not a collective: a rank stuck in a collective, or
stopped outright, can answer nothing, and the launcher must still see how long ago it last moved."""

from __future__ import annotations

import json
import math
import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

# The signal that asks a rank for its stack. Not a stop signal (SIGTERM, SIGINT, SIGUSR1/2 save a checkpoint); the
# ranks register faulthandler for it, which writes from C even while the main thread waits in a collective.
STACK_SIGNAL = signal.SIGQUIT
# The derived bound: this many times the longest gap between two progress events so far, never below the floor.
GAP_FACTOR = 5
FLOOR_S = 180.0
# After the bound, the ranks' time to write their stacks before every process of the node is killed.
STACK_GRACE_S = 10.0
# What a rank is busy with, in its record: nothing, a checkpoint's save, or the run's end (the final model's save
# and publication: no other rank waits for a push, which may outlast any collective timeout).
IDLE, SAVING, ENDING = "", "saving", "ending"
# A save's bound until one has ended: the collective timeout less this, so that the watchdog, with its time for the
# stacks, acts before the ranks waiting in the save's collectives fail without a word on who held them.
SAVE_MARGIN_S = 30.0


@dataclass(frozen=True)
class Progress:
    """One rank's last progress: ``step`` (optimizer steps done), ``where`` in words ("training step 6",
    "evaluating after step 5"), ``at`` (seconds since the epoch), ``busy`` (inside an operation that reports no
    progress while it runs: SAVING, ENDING, else IDLE), ``gap_s`` (the longest time between two of its progress
    events so far, a save's left out), ``save_s`` (its longest checkpoint save so far)."""

    rank: int
    local_rank: int
    pid: int
    step: int
    where: str
    at: float
    busy: str = IDLE
    gap_s: float = 0.0
    began: bool = False  # the record of a step's start (a rank that began step N+1 waits for one that did not)
    save_s: float = 0.0

    def bound(self, hang_timeout: int, collective_timeout: int) -> float:
        """Seconds without progress after which this rank counts as stopped.
        - ENDING: none (a push longer than any collective timeout is no hang; the other ranks wait for final/ only).
        - SAVING: SAVE_MARGIN_S less than ``collective_timeout`` (ddp_timeout: the ranks waiting for a save in a
          collective fail then anyway; at least half of it); once a save of this launch has ended, GAP_FACTOR times
          the longest save if that is less, at least FLOOR_S; never below ``hang_timeout``. Bounded, not
          unwatched: a rank stopped while it saves, or a save stuck on a frozen volume, would otherwise hold the
          node until the collectives time out, with no word on who held them.
        - else ``hang_timeout`` when set, else GAP_FACTOR times its longest gap, at least FLOOR_S."""
        if self.busy == ENDING:
            return math.inf
        if self.busy == SAVING:
            first = max(collective_timeout / 2, collective_timeout - SAVE_MARGIN_S)
            save = min(first, max(FLOOR_S, GAP_FACTOR * self.save_s)) if self.save_s else first
            return max(float(hang_timeout), save)
        if hang_timeout:
            return float(hang_timeout)
        return max(FLOOR_S, GAP_FACTOR * self.gap_s)

    def order(self) -> tuple[int, bool]:
        """How far it got: its step, then whether it had begun the next one."""
        return self.step, self.began


def progress_file(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"progress-rank-{rank}.json"


def stacks_file(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"stacks-rank-{rank}.txt"


def write_progress(directory: str | Path, progress: Progress) -> None:
    """Replace this rank's record whole (a reader never sees half of one)."""
    path = progress_file(directory, progress.rank)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(asdict(progress)), encoding="utf-8")
    os.replace(partial, path)


def read_progress(directory: str | Path) -> list[Progress]:
    """Every rank's record in the directory, by rank; a record that does not read as one is skipped."""
    found = []
    for path in sorted(Path(directory).glob("progress-rank-*.json")):
        try:
            found.append(Progress(**json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(found, key=lambda p: p.rank)


def hung(reports: list[Progress], now: float, hang_timeout: int, collective_timeout: int) -> bool:
    """Whether the node is hung: some rank has reported (before any rank's first step the collective timeout acts
    alone), and none has moved within its bound."""
    return bool(reports) and all(now - p.at > p.bound(hang_timeout, collective_timeout) for p in reports)


def stopped_ranks(reports: list[Progress], nproc: int, answered: set[int]) -> list[str]:
    """The ranks to name, in words: those of the node's ``nproc`` that never reported (by local rank), else those
    behind the others, else those that did not write their stack when asked (stopped, or stuck outside Python),
    else every rank (all stood at the same place: their stacks say where; with several nodes, perhaps waiting for
    another node's)."""
    reported = {p.local_rank for p in reports}
    missing = [f"local rank {r}" for r in range(nproc) if r not in reported]
    if missing:
        return missing
    furthest = max(p.order() for p in reports)
    named = [p for p in reports if p.order() < furthest] or [p for p in reports if p.rank not in answered] or reports
    return [
        f"rank {p.rank} (its last progress: {p.where}"
        + ("; it wrote no stack: stopped?)" if p.rank not in answered else ")")
        for p in named
    ]
