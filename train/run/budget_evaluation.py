"""The held-out sample a time budget evaluates on: its evaluations sized to the budget instead of the budget spent
on them. A 150-second budget with a large held-out split estimated its final evaluation at 151 s, planned 5 steps
that never decayed, and ended at twice its budget (issue 51).

The rule: at the first plan, when one evaluation of the whole held-out set would take more than
:data:`EVALUATION_SHARE` of the budget (its estimate: a forward pass per batch, from the timed steps), every
evaluation of the run - the periodic ones and the final one - reads the first examples of the held-out set that fit
that share (of each source's part, for a mixture: the same share of each), at least one batch. Decided once, so the
losses of a run compare with each other; every rank keeps the same count (the smallest any rank computed).
"""

from __future__ import annotations

import math
from typing import Any

from train.common import distributed
from train.common.console import say
from train.data.tokenization import IndexedExamples
from train.run.budget import agreed_minimum

EVALUATION_SHARE = 0.10  # of the time budget, for one evaluation


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


class EvaluationSizer:
    """Cuts ``trainer``'s held-out set (train/run/trainer.py's MLMTrainer: ``eval_dataset``, a mixture's
    ``eval_parts``, through its ``limit_evaluation``) to what fits; the time budget calls it at its first plan."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def __call__(self, budget_s: float, batches: int, batch_s: float, device: Any) -> int:
        """The batches an evaluation now takes (every rank's smallest count: the same everywhere)."""
        kept = agreed_minimum(batches_that_fit(budget_s, batches, batch_s), device)
        if kept >= batches:
            return batches
        trainer, whole = self.trainer, len(self.trainer.eval_dataset)

        def cut(examples: Any) -> Any:  # the same share of each set: the batches kept of those there were
            return first_examples(examples, max(1, math.floor(len(examples) * kept / batches)))

        parts = trainer.eval_parts
        trainer.limit_evaluation(cut)
        if distributed.is_world_zero():
            say(
                f"time budget: each evaluation reads the first {len(trainer.eval_dataset):,} of the {whole:,} "
                f"held-out examples{' (of each source the same share)' if parts else ''}: the whole set's would "
                f"take about {batches * batch_s:.0f} s, more than {EVALUATION_SHARE:.0%} of the "
                f"{budget_s:.0f} s budget (max_eval_samples sets it for a run without a budget)"
            )
        return kept
