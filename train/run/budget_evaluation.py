"""The held-out sample a time budget evaluates on: its evaluations sized to the budget instead of the budget spent
on them. A 150-second budget with a large held-out split estimated its final evaluation at 151 s, planned 5 steps
that never decayed, and ended at twice its budget (issue 51).

The rule: at the first plan, an evaluation batch is measured through the path an evaluation takes
(:func:`evaluation_batch_seconds`: the median of ``TIMED_BATCHES``, after one that warms up); when one evaluation of the
whole held-out set would take more than :data:`EVALUATION_SHARE` of the budget at that time per batch, every evaluation
of the run - the periodic ones and the final one - reads the first examples of the held-out set that fit that share (of
each source's part, for a mixture: the same share of each), at least one batch. Decided once, so the losses of a run
compare with each other; every rank keeps the same count (the smallest any rank computed).

Measured, not estimated: an estimate from the training steps (a third of a step per batch, a forward pass of a
forward and backward) was wrong both ways. The dense head's evaluation took several times that (a 150 s budget's
final evaluation over 20,000 rows took 62 s, the sizer never cut it, and the run ended 173 s after its launch); the
masked-only head's takes a fraction of it. A median of three: a single batch measured 0.022-0.694 s across runs of
the same model, and the shorter of two measured half of what the evaluation then took per batch.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from train.common import distributed
from train.common.console import say
from train.data.tokenization import IndexedExamples
from train.run.budget import agreed_minimum

EVALUATION_SHARE = 0.10  # of the time budget, for one evaluation
TIMED_BATCHES = 3  # evaluation batches timed, after one that warms up: the median counts


def batches_that_fit(budget_s: float, batches: int, batch_s: float) -> int:
    """The evaluation batches whose time (``batch_s`` each) fits EVALUATION_SHARE of the budget: all of them
    when they fit, one at least."""
    if batches <= 0 or batch_s <= 0:
        return batches
    return max(1, min(batches, math.floor(EVALUATION_SHARE * budget_s / batch_s)))


def first_examples(examples: Any, count: int) -> Any:
    """The first ``count`` examples of a held-out set (an IndexedExamples keeps its positions: the same masks)."""
    if isinstance(examples, IndexedExamples):
        return IndexedExamples(examples.examples.select(range(min(count, len(examples)))), examples.cached)
    return examples[:count]


def evaluation_batch_seconds(trainer: Any) -> float:
    """Seconds one evaluation batch takes on ``trainer`` (train/run/trainer.py's MLMTrainer), measured on the path an
    evaluation takes: a batch of its evaluation loader (evaluation's masking, the loader's workers) through its
    ``prediction_step`` (the forward pass without gradients: the loss, the predictions), the model in eval mode and put
    back in the mode it was in. The first batch warms up (kernels, allocations, the workers' start); the next
    ``TIMED_BATCHES`` are each timed from its loading to its loss read back (the device then done with it), and their
    median counts (one batch that waited for a busy core is not the evaluation's pace); a held-out set of fewer batches
    per rank times its last batch again. Every rank makes the same calls in the same order: under FSDP a forward is a
    collective, and the loader keeps the ranks' batches even. What the loop does around a batch (gathering it across
    ranks, keeping the predictions) is left out: small beside a forward."""
    model, args = trainer.model, trainer.args
    loss_only = trainer.compute_metrics is None or args.prediction_loss_only  # as Trainer.evaluate decides it
    mode = model.training
    with loader_not_kept(args):
        loader = trainer.get_eval_dataloader()
    batches = iter(loader)
    model.eval()
    try:
        batch = next(batches)
        trainer.prediction_step(model, batch, loss_only)
        times = []
        for _ in range(TIMED_BATCHES):
            start = time.monotonic()
            batch = next(batches, batch)
            loss, _, _ = trainer.prediction_step(model, batch, loss_only)
            if loss is not None:
                loss.item()  # read back: the device's queued work done
            times.append(time.monotonic() - start)
        return statistics.median(times)
    finally:
        model.train(mode)
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # the loader's workers stop now, not when it is collected
        # accelerate's loader leaves the list of loaders its gradient state keeps (the last one counts as the
        # active one) at its end only, which a loader left after its first batches never reaches: said here.
        end = getattr(loader, "end", None)
        if end is not None:
            end()


@contextmanager
def loader_not_kept(args: Any) -> Iterator[None]:
    """A loader the Trainer does not keep: with ``dataloader_persistent_workers`` it keeps the first evaluation
    loader it builds and hands it to every later evaluation (transformers 5.25, ``Trainer._get_dataloader``), which
    would then read the whole held-out set the sizer cut after measuring on it."""
    persistent = args.dataloader_persistent_workers
    args.dataloader_persistent_workers = False
    try:
        yield
    finally:
        args.dataloader_persistent_workers = persistent


class EvaluationSizer:
    """Measures an evaluation batch on ``trainer`` (train/run/trainer.py's MLMTrainer) and cuts its held-out set
    (``eval_dataset``, a mixture's ``eval_parts``, through its ``limit_evaluation``) to what fits; the time budget
    calls it at its first plan, on every rank, when the run evaluates."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def __call__(self, budget_s: float, batches: int, device: Any) -> tuple[int, float]:
        """The batches an evaluation now takes (every rank's smallest count: the same everywhere), and one batch's
        measured seconds (:func:`evaluation_batch_seconds`)."""
        batch_s = evaluation_batch_seconds(self.trainer)
        kept = agreed_minimum(batches_that_fit(budget_s, batches, batch_s), device)
        if kept >= batches:
            return batches, batch_s
        trainer, whole = self.trainer, len(self.trainer.eval_dataset)

        def cut(examples: Any) -> Any:  # the same share of each set: the batches kept of those there were
            return first_examples(examples, max(1, math.floor(len(examples) * kept / batches)))

        parts = trainer.eval_parts
        trainer.limit_evaluation(cut)
        if distributed.is_world_zero():
            say(
                f"time budget: each evaluation reads the first {len(trainer.eval_dataset):,} of the {whole:,} "
                f"held-out examples{' (of each source the same share)' if parts else ''}: the whole set's would "
                f"take about {batches * batch_s:.0f} s ({batches:,} batches of {batch_s:.3g} s, measured), more than "
                f"{EVALUATION_SHARE:.0%} of the {budget_s:.0f} s budget (max_eval_samples sets it for a run without a "
                "budget)"
            )
        return kept, batch_s
