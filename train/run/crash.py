"""A rank's unexpected failure, in one line a person can act on: what died and what to change. The traceback goes
to the rank's crash log in output_dir (and to the console with MLM_DEBUG=1), not over the console.

What the libraries lack: torch says "DataLoader worker (pid 4242) is killed by signal: Killed." inside a
traceback, and Python prints every exception as a wall of frames; a Kubernetes or Slurm user reading a pod's log
needs the cause and the fix.
"""

from __future__ import annotations

import re
import traceback

from train.common.errors import (
    EXIT_CRASH,
    OOM_KILLER,
    EnvironmentProblem,
    UserError,
    first_line,
    signal_named,
    why_killed,
)
from train.outputs.runfiles import RunFiles

# torch 2.15, torch/utils/data: the C++ SIGCHLD check, and the Python side's timeout on a dead worker.
_WORKER_KILLED = re.compile(r"DataLoader worker \(pid ([0-9]+)\) is killed by signal: ([^.]+)")
_WORKER_EXITED = re.compile(r"DataLoader worker \(pid\(s\) ([0-9, ]+)\) exited unexpectedly")


# gloo (torch 2.15): "Application timeout caused pair closure", "Timed out waiting 10000ms for recv operation";
# NCCL's watchdog: "Watchdog caught collective operation timeout".
_COLLECTIVE_TIMEOUT = re.compile(r"timeout caused pair closure|timed out waiting|collective operation timeout", re.I)


def collective_timeout(exc: BaseException, label: str, seconds: float) -> UserError | None:
    """The line for a collective that another rank never joined within ddp_timeout (``label`` names the option),
    or None. Exit 1: a retry may well find every rank answering."""
    if not _COLLECTIVE_TIMEOUT.search(str(exc)):
        return None
    return UserError(
        f"no answer from another rank for {label}={seconds:g} s ({first_line(exc)}): a rank hung or was stopped "
        "(a stuck node, a frozen process); the run ends here - check that rank's node and logs",
        exit_code=EXIT_CRASH,
    )


WORKER_REMEDY = "lower MLM_DATALOADER_NUM_WORKERS or raise the memory limit"


def worker_death(exc: BaseException) -> EnvironmentProblem | None:
    """The line for a DataLoader worker that died under its rank, or None when ``exc`` is something else."""
    text = str(exc)
    killed = _WORKER_KILLED.search(text)
    if killed:
        name = signal_named(killed.group(2))
        why = why_killed(name, WORKER_REMEDY)
        return EnvironmentProblem(f"a DataLoader worker was killed ({name}, pid {killed.group(1)}): {why}")
    exited = _WORKER_EXITED.search(text)
    if exited:
        return EnvironmentProblem(
            f"a DataLoader worker exited unexpectedly (pid {exited.group(1)}): {OOM_KILLER} - {WORKER_REMEDY}"
        )
    return None


def unexpected(exc: BaseException, files: RunFiles, rank: int) -> UserError:
    """Exit 1 (a crash: worth a retry) naming the exception's type and first line; the traceback is written to
    the rank's crash log, when output_dir can take it."""
    where = ""
    log = files.crash_log(rank)
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(traceback.format_exception(exc)), encoding="utf-8")
        where = f"; traceback in {log}"
    except OSError:
        where = "; MLM_DEBUG=1 shows the traceback"
    return UserError(f"rank {rank} crashed: {type(exc).__name__}: {first_line(exc)}{where}", exit_code=EXIT_CRASH)
