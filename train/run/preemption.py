"""Stopping on a signal with a checkpoint: SIGTERM (docker stop, eviction, spot reclaim), SIGINT (Ctrl-C), and
SIGUSR1/SIGUSR2 (Slurm's ``--signal``) all mean "save and exit 75".

What the Trainer lacks: it has no signal handling at all, and the ranks of one job receive a signal at different
moments (torchrun forwards it to each in turn), so they must agree before acting or one rank would wait forever
in a collective the others left. Each rank therefore only records the request; at every step end, every
evaluation step and every save, the ranks agree through one tiny all-reduce and act together:

- at a step end: save a checkpoint at this step and stop (without the end-of-epoch evaluation);
- during an evaluation: stop evaluating at once (:class:`EvaluationInterrupted`), and the job saves the step;
- during a checkpoint save: the save finishes (the signal only sets a flag), then the run stops without another.

A second SIGINT aborts at once (exit 130), as a person pressing Ctrl-C twice expects.

A checkpoint written in the background (train/run/saving.py) is whole before the rank exits: the end of training
waits for the save in flight, and so does a stop's save inside an evaluation (the job saves after the loop).

In a run with a time budget, a stop is a deadline come early: once the stop's checkpoint is saved, the budget
(train/run/budget.py) may let the run go on for the steps that fit before torchrun's stop timeout, decaying the
learning rate, and end with a final model; the stopper then only keeps those steps from saving or evaluating.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from train.common import distributed
from train.common.errors import STOP_SIGNALS
from train.common.lifetime import die_with_parent


class EvaluationInterrupted(Exception):
    """Raised on every rank at the same evaluation step when a stop was agreed."""


class StopOnSignal(TrainerCallback):
    """Record stop signals; at each step end, evaluation step and save, agree across ranks and stop."""

    def __init__(self) -> None:
        self.received: int | None = None  # the first stop signal this rank got
        self.received_at: float | None = None  # when it came (seconds since the epoch)
        self.stopped = False  # the ranks agreed and stopped: a checkpoint holds the last step
        self.finishing = False  # stopped, then a cut-short decay (train/run/budget.py): no saves, no evaluations
        # Stopped inside an evaluation: the training loop is left, the job saves the step itself (no window after it)
        self.interrupted_evaluation = False
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._handle)

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.received).name if self.received else "a signal"

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.received is not None:
            os._exit(130)  # the second Ctrl-C: abort now, like a shell
        if self.received is None:
            self.received = signum
            self.received_at = time.time()

    def agreed(self, device: torch.device) -> bool:
        """Whether any rank was asked to stop; every rank must call this at the same point."""
        if not distributed.initialized():
            return self.received is not None
        flag = torch.tensor([0.0 if self.received is None else 1.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.finishing:  # the steps after the stop's checkpoint: none of them is resumed from or judged
            control.should_save = control.should_evaluate = False
            return
        if self.agreed(args.device):
            self.stopped = True
            control.should_save = True
            control.should_training_stop = True

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Breaking out of the steps still ends the epoch, where the eval strategy "epoch" would evaluate (a wait the
        # grace period cannot afford) and "save" would save again: the checkpoint of this step exists already.
        if self.stopped:
            control.should_evaluate = False
            control.should_save = False

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # A signal that arrived while this checkpoint was written: it holds the newest step, stop without another.
        if not self.stopped and self.agreed(args.device):
            self.stopped = True
            control.should_training_stop = True

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.finishing and self.agreed(args.device):  # finishing: the final evaluation, planned to fit
            raise EvaluationInterrupted


def _worker_ignores_stop_signals(worker_id: int, init_fn: Callable[[int], None] | None) -> None:
    """Data loader worker init: ignore the stop signals, then the Trainer's own init (seeding).

    torchrun stops a rank with killpg(), which reaches the rank's data loader workers too; PyTorch's workers die
    on a SIGTERM that is not from their parent (and SIGUSR1's default action is to terminate), and the rank would
    then fail its step with "DataLoader worker ... killed by signal" instead of saving the checkpoint. The rank
    shuts its workers down itself (and on a crash kills them: train/common/lifetime.py).
    """
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    # Ignoring SIGTERM, a worker would outlive a rank killed outright (SIGKILL, the OOM killer); torch's own check
    # of its parent runs only every few seconds, between batches.
    die_with_parent(signal.SIGKILL)
    if init_fn is not None:
        init_fn(worker_id)


def leave_signals_to_rank(loader: Any) -> Any:
    """The loader, with workers that leave the stop signals to their rank."""
    # accelerate's prepared loader wraps the torch DataLoader (base_dataloader) and forwards attribute reads only.
    base = getattr(loader, "base_dataloader", loader)
    base.worker_init_fn = functools.partial(_worker_ignores_stop_signals, init_fn=base.worker_init_fn)
    return loader
