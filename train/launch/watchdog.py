"""The hang watchdog: the launcher watches its node's ranks' progress (train/common/progress.py, written by
train/run/progress.py) while torchrun runs; when none has moved within its bound, it asks each for its Python stack,
gives them STACK_GRACE_S to write it, names the ranks that stopped and where, and kills every process of the node.
The launch then ends with EXIT_HUNG (76), which the cluster retries (docs/exit-codes.md): the same command resumes.

Without it a rank stuck in a driver call, a frozen node or a data loader that stops yielding holds every other
rank in its next collective until ddp_timeout (30 minutes), and torchrun then gives the silent rank the stop
timeout more; nothing said which rank or where. Each node's launcher watches its own ranks: on the other nodes the
ranks wait in a collective for one that is gone, and torchrun's rendezvous ends them (or their own watchdog does)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from train.common.errors import EXIT_HUNG
from train.common.progress import (
    FLOOR_S,
    GAP_FACTOR,
    SAVE_MARGIN_S,
    SAVING,
    STACK_GRACE_S,
    STACK_SIGNAL,
    Progress,
    hung,
    read_progress,
    stacks_file,
    stopped_ranks,
)

POLL_S = 1.0


@dataclass(frozen=True)
class HangBound:
    """The watchdog's settings: ``timeout`` (hang_timeout, 0: derived from the run), ``collective_timeout``
    (ddp_timeout: a save's bound until one has ended), ``logs`` (where the stacks are kept: output_dir/logs on this
    node), ``source`` (how an explicit timeout was set, as errors name options)."""

    timeout: int
    collective_timeout: int
    logs: Path
    source: str = "hang_timeout"

    def of(self, report: Progress) -> float:
        return report.bound(self.timeout, self.collective_timeout)

    def words(self, reports: list[Progress]) -> str:
        longest = max(self.of(p) for p in reports)
        if any(p.busy == SAVING and self.of(p) == longest for p in reports):
            most = f"at most ddp_timeout={self.collective_timeout} less {SAVE_MARGIN_S:.0f} s"
            return f"{longest:.0f} s (a checkpoint's save: {GAP_FACTOR}x the longest so far, {most})"
        if self.timeout:
            return f"{longest:.0f} s ({self.source}={self.timeout})"
        derived = f"{GAP_FACTOR}x the run's longest gap between two steps, at least {FLOOR_S:.0f} s"
        return f"{longest:.0f} s ({derived}; {self.source} sets it)"


class HangWatch:
    """Watches ``directory`` (the launch's exit directory) for the node's ``nproc`` ranks under ``bound`` (one node
    of ``nodes``); once it has ended a hung node (``end``, given torchrun's pid, after ``grace_s`` for the stacks),
    ``verdict`` holds the one line to say."""

    def __init__(
        self,
        directory: str,
        nproc: int,
        bound: HangBound,
        end: Callable[[int], None],
        grace_s: float = STACK_GRACE_S,
        nodes: int = 1,
    ) -> None:
        self.directory, self.nproc, self.bound, self.end, self.grace_s = directory, nproc, bound, end, grace_s
        self.nodes = nodes
        self.verdict: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, agent_pid: int) -> None:
        self._thread = threading.Thread(target=self._watch, args=(agent_pid,), name="hang-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self, agent_pid: int) -> None:
        while not self._stop.wait(POLL_S):
            reports = read_progress(self.directory)
            if hung(reports, time.time(), self.bound.timeout, self.bound.collective_timeout):
                self.verdict = self._end_hung(reports, agent_pid)
                return

    def _end_hung(self, reports: list[Progress], agent_pid: int) -> str:
        """Stacks asked for and kept, the ranks named, every process of the node killed (``end``): the line."""
        for report in reports:  # only ranks that reported registered the stack's handler (else SIGQUIT kills)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(report.pid, STACK_SIGNAL)
        answered = self._stacks_written(reports)
        named = stopped_ranks(reports, self.nproc, answered)
        kept = self._keep_stacks(answered)
        self.end(agent_pid)
        who = ", ".join(named) + " stopped"
        if self.nodes > 1 and len(named) == len(reports):  # none of this node's stands out: another's may hold them
            who += f" (of {self.nodes} nodes: these may wait for another node's ranks, which its own line names)"
        stacks = f"; stacks in {kept}/stacks-rank-N.txt" if answered else "; no rank wrote its stack"
        return (
            f"hung: no progress for {self.bound.words(reports)}: {who}; every process of this node was ended, "
            f"exit {EXIT_HUNG}: run the same command to resume from the last checkpoint{stacks}"
        )

    def _stacks_written(self, reports: list[Progress]) -> set[int]:
        deadline = time.monotonic() + self.grace_s
        answered: set[int] = set()
        while True:
            answered = {p.rank for p in reports if _size(stacks_file(self.directory, p.rank)) > 0}
            if len(answered) == len(reports) or time.monotonic() > deadline:
                time.sleep(0.2)  # a stack is written in several writes: let the last ones land
                return answered
            time.sleep(0.2)

    def _keep_stacks(self, ranks: set[int]) -> Path:
        """The stacks copied where the run's logs are (the exit directory goes with the launch). Each lands under a
        new name and replaces the old one: a link planted at its name on a shared volume is replaced, never written
        through."""
        logs = self.bound.logs
        with contextlib.suppress(OSError):
            if ranks:
                logs.mkdir(parents=True, exist_ok=True)
            for rank in sorted(ranks):
                kept = logs / f"stacks-rank-{rank}.txt"
                partial = logs / f".{kept.name}.{os.getpid()}"
                descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                with os.fdopen(descriptor, "wb") as out:
                    out.write(stacks_file(self.directory, rank).read_bytes())
                os.replace(partial, kept)
        return logs


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
