"""A rank's progress, told to its launcher's hang watchdog (train/launch/watchdog.py; the record and the rules:
train/common/progress.py): a step begun or finished, an evaluation batch, a checkpoint saved; and its Python stack
written on request.

Why a file and not torch's own watchdogs: NCCL's watchdog and heartbeat end a collective that does not complete,
after the collective timeout (30 minutes by default, with 4.5 more for torchrun), and say nothing of which rank
held the others; gloo has none; torch.distributed.elastic's timers bound blocks of code a worker marks in advance
and kill only that worker, without a stack or a word on where it stood. Here each rank reports where it is, and
the launcher, which sees every rank of its node, decides, asks each for its stack (faulthandler, which writes from
C even while the main thread waits in a collective) and ends them all."""

from __future__ import annotations

import faulthandler
import os
import time
from typing import IO, Any

from transformers import TrainerCallback

from train.common import distributed
from train.common.errors import EXIT_DIR_ENV
from train.common.progress import ENDING, IDLE, SAVING, STACK_SIGNAL, Progress, stacks_file, write_progress

# At most one write a second while nothing changes but the batch (an evaluation's batches come fast).
WRITE_EVERY_S = 1.0


class ProgressReport(TrainerCallback):
    """Rewrites this rank's progress record in ``directory`` at each event of progress. Added after every other
    callback: at a step's end it reads the save and evaluation the others asked for."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.rank, self.local_rank = distributed.world_rank(), int(os.environ.get("LOCAL_RANK", "0"))
        self.last: Progress | None = None
        self.gap_s = 0.0
        self.save_s = 0.0
        self.event_at = 0.0
        self.ended = False
        self.stacks: IO[str] = open(stacks_file(directory, self.rank), "w", encoding="utf-8")  # noqa: SIM115
        faulthandler.register(STACK_SIGNAL, file=self.stacks, all_threads=True, chain=False)

    def report(self, step: int, where: str, busy: str = IDLE, began: bool = False) -> None:
        now = time.time()
        last = self.last
        if last is not None and not last.busy:  # a save has its own bound (from the longest save): not a gap
            self.gap_s = max(self.gap_s, now - self.event_at)
        elif last is not None and last.busy == SAVING and busy != SAVING:  # a save ended
            self.save_s = max(self.save_s, now - last.at)
        self.event_at = now
        if last is not None and last.where == where and last.busy == busy and now - last.at < WRITE_EVERY_S:
            return
        self.last = Progress(
            self.rank, self.local_rank, os.getpid(), step, where, now, busy, round(self.gap_s, 3), began,
            round(self.save_s, 3),
        )  # fmt: skip
        write_progress(self.directory, self.last)

    def waiting(self, step: int) -> None:
        """Before the save's collective (the ranks' digests gathered: train/run/callbacks.py): this rank's own files
        are written, it now waits for the others' under the hang bound, not the save's."""
        self.report(step, f"waiting for the other ranks' files of checkpoint-{step}")

    def saving(self, step: int) -> None:
        """After that collective: saving again (digests, the marker, the rotation, an upload), under a save's bound."""
        self.report(step, f"saving a checkpoint after step {step}", busy=SAVING)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.ended = False  # training again (after a rollback)
        self.report(state.global_step, f"training step {state.global_step + 1}", began=True)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # A save is marked at the last event before it (here, at the log or at the evaluation), after the
        # collectives that precede it: a rank waiting in those for a stopped one is watched under the hang bound.
        step = state.global_step
        if control.should_evaluate:
            self.report(step, f"evaluating after step {step}")
        elif control.should_save and not control.should_log:
            self.saving(step)
        else:
            self.report(step, f"finished step {step}")

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if control.should_save and not control.should_evaluate:  # the step's log, gathered; its save follows
            self.saving(state.global_step)

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.report(state.global_step, f"evaluating after step {state.global_step}")

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if control.should_save:
            self.saving(state.global_step)
        elif self.ended:  # the final evaluation: the final model's save and publication follow
            self.report(state.global_step, f"ending after step {state.global_step}", busy=ENDING)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.report(state.global_step, f"saved a checkpoint at step {state.global_step}")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The final evaluation, save and publication follow, with no step to report (an upload may take long).
        self.ended = True
        self.report(state.global_step, f"ending after step {state.global_step}", busy=ENDING)


def progress_report(environ: dict[str, str] | None = None) -> ProgressReport | None:
    """This rank's report where a launcher watches (it sets the exit directory), else None (a bare torchrun)."""
    directory = (os.environ if environ is None else environ).get(EXIT_DIR_ENV)
    return ProgressReport(directory) if directory else None
