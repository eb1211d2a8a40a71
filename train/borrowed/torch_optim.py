"""What we borrow from torch's learning-rate schedulers (torch 2.15, ``torch/optim/lr_scheduler.py``): the
functions inside a ``LambdaLR`` and its peak rates. No import of torch here: the report (train/report/schedule.py)
reads a run's logs without it."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from train.borrowed.touch import borrows


@borrows("torch", "2.15", "optim/lr_scheduler.py LambdaLR.lr_lambdas")
def lr_functions(scheduler: Any) -> list[Callable[[int], float]] | None:
    """A ``LambdaLR``'s learning-rate multipliers, one per parameter group, as functions of the step (torch 2.15,
    ``torch/optim/lr_scheduler.py``, the attribute ``LambdaLR.lr_lambdas`` that ``get_lr`` calls); None for a
    scheduler that has none. transformers builds every step schedule as a LambdaLR and exposes no function of the
    step: the report draws the schedule from it, the time budget reads and rebuilds it."""
    return getattr(scheduler, "lr_lambdas", None)


@borrows("torch", "2.15", "optim/lr_scheduler.py LambdaLR.lr_lambdas, LambdaLR.get_lr")
def replace_lr_functions(scheduler: Any, functions: Sequence[Callable[[int], float]]) -> None:
    """Make the live ``LambdaLR`` follow ``functions`` from the step ahead on (torch 2.15,
    ``torch/optim/lr_scheduler.py``: ``LambdaLR.get_lr`` calls ``self.lr_lambdas[i](self.last_epoch)`` at each
    step). The time budget re-plans mid-run: the Trainer built its scheduler (through accelerate's wrapper) before
    the plan existed, ``create_scheduler`` runs once, callbacks cannot swap the Trainer's scheduler, and a new one
    would lose the step count the checkpoints record. Neither torch nor transformers can re-plan a live one.

    A re-plan comes after the step's own scheduler step, which has set the optimizer's rate for the step ahead from
    the old functions: that rate is set again from the new ones, as the scheduler's step would (``last_epoch``
    back one, then ``step``, both public). Left alone, the step after a re-plan trained at the old plan's rate,
    and a plan re-made one step before its end ended at another plan's rate."""
    scheduler.lr_lambdas = list(functions)
    scheduler.last_epoch -= 1
    scheduler.step()


@borrows("torch", "2.15", "optim/lr_scheduler.py LRScheduler.base_lrs, LambdaLR.get_lr")
def scale_peaks(scheduler: Any, ratio: float) -> None:
    """Multiply a live ``LambdaLR``'s peak rates by ``ratio`` and set the optimizer's rate for the step ahead from
    them (torch 2.15, ``torch/optim/lr_scheduler.py``: ``get_lr`` is ``base_lr * lr_lambda(last_epoch)`` for each
    of ``base_lrs``, which ``load_state_dict`` restores from a checkpoint). A branch (train/run/branching.py) resumes
    its parent's scheduler state but runs at its own learning rate; torch has no public setter for the peaks.
    ``last_epoch`` back one, then ``step`` (both public) recompute the step's rate, as in
    :func:`replace_lr_functions`; the warning that a scheduler steps before its optimizer is silenced: no step is
    skipped, the count is the same afterwards."""
    scheduler.base_lrs = [rate * ratio for rate in scheduler.base_lrs]
    scheduler.last_epoch -= 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        scheduler.step()
