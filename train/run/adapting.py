"""Adapting a pretrained encoder without breaking it (docs/models.md): its embeddings and first layers frozen
(``freeze_layers``), the MLM head warmed up alone (``head_warmup_steps``) and at a rate of its own
(``head_learning_rate``), and at every evaluation how far the encoder moved (``eval_encoder_cosine``).

How far it moved: the mean cosine similarity between the adapted encoder's mean-pooled last hidden states and the
starting model's, on the first :data:`DRIFT_SAMPLE` held-out examples. The starting model's embeddings are computed
once, before training (a resumed run's too: its weights are loaded later, so the reference stays the model handed
over), so no second model is kept in memory. A cosine below :data:`DRIFT_WARNING` is a warning: continued
pretraining at a rate meant for a new head can turn a sentence encoder's embeddings into another space (issue 51:
all-MiniLM-L6-v2 at 2e-4 fell to 0.32-0.49, unrelated sentences became similar), which the MLM loss never shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule

from train.common import distributed
from train.common.console import say, warn
from train.common.errors import ConfigError
from train.config import AdaptingArguments, ModelArguments
from train.model.adapting import (
    DRIFT_WARNING,
    encoder_parameters,
    freeze_first_layers,
    head_parameters,
    held_out_batch,
    mean_cosine,
    pooled_embeddings,
)
from train.run.trainer_settings import HeadTraining

AUTO_WARMUP = -1  # unset, and the head new: the learning rate's warm-up (a tenth of the run at most), at the first step
DRIFT_SAMPLE = 64  # held-out examples the drift is measured on: a forward pass of 64 rows at each evaluation
DRIFT_METRIC = "encoder_cosine"  # eval_encoder_cosine in the evaluation records and the final results


def adapting_options(adapting: AdaptingArguments) -> list[str]:
    """The adapting options this run sets (all of them off by default)."""
    head_rate, frozen = adapting.head_learning_rate is not None, adapting.freeze_layers is not None
    used = {
        "head_warmup_steps": bool(adapting.head_warmup_steps),
        "head_learning_rate": head_rate,
        "freeze_layers": frozen,
    }
    return [name for name, on in used.items() if on]


def check_adapting(adapting: AdaptingArguments, model: ModelArguments, scratch: bool) -> None:
    """Before any data: freezing or warming up a head only means something for a pretrained model."""
    for name in adapting_options(adapting) if scratch else []:
        if name != "head_learning_rate":
            raise ConfigError(
                f"{adapting.source_of(name)}={getattr(adapting, name)}: adapts a pretrained model, and "
                f"{model.source_of('model_name_or_path')}={model.model_name_or_path} is trained from scratch; "
                "unset it"
            )


def freeze_layers(adapting: AdaptingArguments, model: Any) -> list[str]:
    """The embeddings and the first ``freeze_layers`` layers frozen for the whole run (before DDP wraps the model:
    it leaves parameters that do not train out); the names frozen, said once."""
    count = adapting.freeze_layers
    if count is None:
        return []
    frozen = freeze_first_layers(model, count, adapting.source_of("freeze_layers"))
    if distributed.is_world_zero():
        say(f"{adapting.source_of('freeze_layers')}={count}: the embeddings and {count} first layer(s) stay as loaded")
    return frozen


def head_training(adapting: AdaptingArguments, model: Any, scratch: bool, new_head: bool) -> HeadTraining:
    """How ``model``'s head trains (the Trainer's settings, train/run/trainer_settings.py): its parameters and
    rate, and the warm-up's frozen encoder (by default for a pretrained model's ``new_head``: the learning rate's
    warm-up, :data:`AUTO_WARMUP`)."""
    head = head_parameters(model)
    warmup = adapting.head_warmup_steps
    if warmup is None:  # fsdp refuses a set warm-up; its default stays off there (not tried on shards)
        warmup = AUTO_WARMUP if new_head and head and not scratch and not isinstance(model, FSDPModule) else 0
    for name, used in (
        ("head_warmup_steps", bool(adapting.head_warmup_steps)),
        ("head_learning_rate", adapting.head_learning_rate is not None),
    ):
        if used and not head:
            raise ConfigError(
                f"{adapting.source_of(name)}: {type(model).__name__} has no MLM head apart from its encoder"
            )
    frozen = tuple(encoder_parameters(model)) if warmup else ()
    return HeadTraining(tuple(head), adapting.head_learning_rate, warmup, frozen)


def drift_batch(model: Any, validation: Any, pad_id: int | None, scratch: bool) -> dict[str, torch.Tensor] | None:
    """The held-out rows the Trainer measures the encoder's drift on at every evaluation (:class:`EncoderDrift`),
    for a pretrained model with held-out data (``validation``: None when nothing is evaluated); else None."""
    # Under fsdp the encoder's own forward would meet the root unit's sharded parameters: not measured there yet.
    if scratch or validation is None or isinstance(model, FSDPModule):
        return None
    return held_out_batch(validation, DRIFT_SAMPLE, pad_id if pad_id is not None else 0)


def with_head_rate(optimizer: torch.optim.Optimizer, head: tuple[Any, ...], rate: float) -> None:
    """Each of ``optimizer``'s groups split in two, its head's parameters in a group at ``rate`` (its weight decay as
    it was), in place: built by the Trainer, not stepped yet. The scheduler, built after, scales each group's own
    rate by the same schedule, so the head keeps its ratio to the encoder's rate all along."""
    ids = {id(p) for p in head}
    groups = []
    for group in optimizer.param_groups:
        rest = [p for p in group["params"] if id(p) not in ids]
        mine = [p for p in group["params"] if id(p) in ids]
        groups += [{**group, "params": rest}] if rest else []
        groups += [{**group, "params": mine, "lr": rate}] if mine else []
    optimizer.param_groups.clear()
    for group in groups:
        optimizer.add_param_group(group)


def drop_encoder_gradients(parameters: tuple[Any, ...]) -> None:
    """The encoder's gradients of this micro-batch dropped (None): the optimizer skips a parameter without one
    (no update, no weight decay, no moments), and clipping measures the head's alone."""
    for parameter in parameters:
        parameter.grad = None


class EncoderDrift:
    """The starting model's pooled embeddings of a fixed held-out batch, and the current model's cosine to them."""

    def __init__(self, model: Any, batch: dict[str, torch.Tensor]) -> None:
        self.model, self.batch = model, batch
        self.reference = pooled_embeddings(model, batch)
        self.warned = False

    def cosine(self) -> float:
        """The current encoder's mean cosine to the starting one, warned of once below :data:`DRIFT_WARNING`."""
        value = mean_cosine(self.reference, pooled_embeddings(self.model, self.batch))
        if value < DRIFT_WARNING and not self.warned and distributed.is_world_zero():
            self.warned = True
            warn(
                f"the encoder moved far from the model handed over: eval_{DRIFT_METRIC} {value:.3f} < "
                f"{DRIFT_WARNING} (its held-out embeddings' mean cosine to the starting model's); to keep them, "
                "lower learning_rate, warm a new head up first (head_warmup_steps, head_learning_rate) or freeze "
                "layers (freeze_layers): docs/models.md"
            )
        return value

    def alongside(
        self, compute_metrics: Callable[[Any], dict[str, float]], step: Callable[[], int]
    ) -> Callable[[Any], dict[str, float]]:
        """``compute_metrics`` with the drift added (every rank computes it: the Trainer calls it on each), measured
        once a ``step`` (the trainer's): a mixture's evaluation calls compute_metrics once per source, on the same
        weights."""
        measured: dict[int, float] = {}

        def metrics(eval_pred: Any) -> dict[str, float]:
            now = step()
            if now not in measured:
                measured.clear()
                measured[now] = round(self.cosine(), 6)
            return {**compute_metrics(eval_pred), DRIFT_METRIC: measured[now]}

        return metrics
