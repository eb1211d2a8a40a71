"""When the run must be over: ``time_budget`` counted from the launch (or the moment it names), or the Slurm job's
end time when it comes first (``time_budget: slurm`` takes that alone). A Slurm job's limit never counts unasked:
a long training run that a chain of requeued jobs carries on, checkpoint to checkpoint, must not decay and finish
in the first. Decided once here, by the launcher of each node; the ranks plan their steps to it
(train/run/budget.py) and agree on the smallest plan, so nodes launched a moment apart still stop at the same step.

The launch is the launcher process's start (entrypoint.sh execs it): the seconds spent importing count against the
budget as they count against a scheduler's limit. Slurm's end time is asked of the controller (``squeue``), as
Slurm 22.05 hands a job no variable holding it.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psutil

from train.common import durations
from train.common.errors import ConfigError
from train.config import BudgetArguments

# Below this much time left at launch not even one step fits: the ranks' start-up (imports, model, data) alone
# takes longer on the smallest model here, before the final evaluation and save.
MIN_SECONDS_LEFT = 30.0
SQUEUE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Deadline:
    at: float  # seconds since the epoch
    source: str  # what set it, in words: "MLM_TIME_BUDGET=2h", "the Slurm job 42's end time"
    budget_s: float  # the time from the launch to ``at``


def launched_at() -> float:
    """When this launch began: the launcher process's start."""
    return psutil.Process(os.getpid()).create_time()


def slurm_end_time(environ: Mapping[str, str], squeue: Callable[[str], str] | None = None) -> float | None:
    """The Slurm job's end time (seconds since the epoch), inside a job with a time limit; None otherwise or when
    the controller cannot say."""
    job = environ.get("SLURM_JOB_ID", "").strip()
    if not job:
        return None
    try:
        answer = (squeue or _squeue)(job).strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_slurm_time(answer)


def _squeue(job: str) -> str:
    done = subprocess.run(
        ["squeue", "--noheader", "--jobs", job, "--format", "%e"],
        capture_output=True,
        text=True,
        timeout=SQUEUE_TIMEOUT_S,
        check=True,
    )
    return done.stdout


def parse_slurm_time(text: str) -> float | None:
    """squeue's ``%e``: ``2026-12-03T18:00:00`` in the controller's local time (this machine's, as Slurm prints
    it); ``N/A``, ``Unknown`` or nothing for a job without a limit."""
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        return None


def run_deadline(
    budget: BudgetArguments,
    environ: Mapping[str, str],
    started: float | None = None,
    now: float | None = None,
    squeue: Callable[[str], str] | None = None,
) -> Deadline | None:
    """The earlier of the time budget's end (``budget.time_budget``) and the Slurm job's; None without either. Exit 2
    when it leaves too little time for one step."""
    asked = budget.time_budget
    if not asked:
        return None
    started = launched_at() if started is None else started
    now = time.time() if now is None else now
    label = f"{budget.source_of('time_budget')}={asked}"
    found: list[Deadline] = []
    moment = durations.until(asked)
    if moment is not None:  # an end time, set where the job was submitted: the same for every node and restart
        found.append(Deadline(moment, label, moment - started))
    elif asked.strip().lower() != durations.SCHEDULER:
        length = durations.seconds(asked) or 0.0
        found.append(Deadline(started + length, label, length))
    end = slurm_end_time(environ, squeue)
    if end is not None:
        job = environ["SLURM_JOB_ID"]
        found.append(Deadline(end, f"{label}: the Slurm job {job}'s end time", end - started))
    elif not found:
        where = (
            f"the Slurm job {environ['SLURM_JOB_ID']} has no time limit"
            if environ.get("SLURM_JOB_ID")
            else ("not inside a Slurm job (SLURM_JOB_ID is unset)")
        )
        raise ConfigError(f"{label}: {where}; give a duration instead (90m, 2h, 1h30m, 45s, or seconds)")
    deadline = min(found, key=lambda d: d.at)
    left = deadline.at - now
    if left < MIN_SECONDS_LEFT:
        raise ConfigError(
            f"{deadline.source}: {max(left, 0):.0f} s are left once the launcher has started, too few for the "
            f"ranks' start-up, one step, the final evaluation and save (at least {MIN_SECONDS_LEFT:.0f} s); give a "
            "longer time budget"
        )
    return deadline


def deadline_document(deadline: Deadline | None) -> dict[str, Any] | None:
    """The deadline as ``plan`` prints it and run.json keeps it."""
    if deadline is None:
        return None
    at, budget = durations.utc_clock(deadline.at), durations.shown(deadline.budget_s)
    return {"at": at, "source": deadline.source, "budget": budget}


def deadline_line(deadline: Deadline) -> str:
    """The launcher's line for it."""
    at, budget = durations.utc_clock(deadline.at), durations.shown(deadline.budget_s)
    return f"time budget {budget} ({deadline.source}): the run ends by {at}; its steps are planned once a few are timed"
