"""Adapting a pretrained encoder without breaking it: which parameters are the MLM head's, which are the embeddings
and the first layers (to freeze), and the encoder's pooled embeddings of held-out text (to measure how far it moved).

One rule for every architecture, no list of attribute names: the head is every parameter outside the encoder
(``base_model``), the tied decoder being the word embeddings' own parameter (``named_parameters`` yields it once,
under the encoder's name), as train/model/weights.py splits a checkpoint's tensors; the layers are the encoder's
transformers layers (``GradientCheckpointingLayer``, the rule train/run/sharding.py shards by, or MPNet's list of
``num_hidden_layers`` modules); the embeddings are
the encoder's ``embeddings`` module (BERT, RoBERTa, DistilBERT, ELECTRA, ALBERT, DeBERTa-v2, ModernBERT, MPNet, ESM),
else its input embeddings. ALBERT's layers share one set of weights: it has no first layers to freeze apart.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.modeling_layers import GradientCheckpointingLayer

from train.common.errors import ConfigError

DRIFT_WARNING = 0.8  # below this mean cosine to the starting model the encoder is warned of (logs and card)


def encoder_of(model: Any) -> torch.nn.Module:
    """The model's encoder (``base_model``): a masked LM always has one here (train/model/head.py checks it)."""
    return getattr(model, "base_model", model)


def head_parameters(model: Any) -> list[torch.nn.Parameter]:
    """The MLM head's parameters: every one outside the encoder (a decoder tied to the embeddings is theirs)."""
    prefix = getattr(model, "base_model_prefix", "")
    if not prefix or encoder_of(model) is model:
        return []
    return [p for n, p in model.named_parameters() if not n.startswith(f"{prefix}.")]


def encoder_parameters(model: Any) -> list[torch.nn.Parameter]:
    """Every parameter that is not the head's (:func:`head_parameters`)."""
    head = {id(p) for p in head_parameters(model)}
    return [p for p in model.parameters() if id(p) not in head]


def freeze_first_layers(model: Any, count: int, option: str) -> list[str]:
    """Stop training the encoder's embeddings and its first ``count`` layers (the whole run); their names.
    ConfigError naming ``option`` when the model has fewer layers, or none found by the rule."""
    encoder = encoder_of(model)
    layers = layers_of(model)
    if count > len(layers):
        found = f"has {len(layers)} layers" if layers else "has no separate layers found (ALBERT shares one set)"
        raise ConfigError(f"{option}={count}: {type(model).__name__} {found}; expected at most {len(layers)}")
    embeddings = getattr(encoder, "embeddings", None)
    modules = [embeddings if isinstance(embeddings, torch.nn.Module) else model.get_input_embeddings()]
    chosen = {id(p) for module in [*modules, *layers[:count]] for p in module.parameters()}
    frozen = [n for n, p in model.named_parameters() if id(p) in chosen and p.requires_grad]
    for parameter in model.parameters():
        if id(parameter) in chosen:
            parameter.requires_grad_(False)
    return frozen


def layers_of(model: Any) -> list[torch.nn.Module]:
    """The encoder's layers, first to last: its transformers layers, else (MPNet: its layers are plain modules)
    the first list of modules as long as the config's ``num_hidden_layers``; none found: an empty list."""
    encoder = encoder_of(model)
    layers = [m for m in encoder.modules() if isinstance(m, GradientCheckpointingLayer)]
    if layers:
        return layers
    count = getattr(model.config, "num_hidden_layers", None)
    lists = (m for m in encoder.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == count)
    return list(next(lists, []))


def held_out_batch(examples: Any, count: int, pad_id: int) -> dict[str, torch.Tensor] | None:
    """The first ``count`` tokenized held-out examples (``input_ids`` rows) as one padded batch; None without any."""
    rows = [list(examples[i]["input_ids"]) for i in range(min(count, len(examples)))]
    rows = [row for row in rows if row]
    if not rows:
        return None
    longest = max(len(row) for row in rows)
    ids = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return {"input_ids": ids, "attention_mask": mask}


@torch.no_grad()
def pooled_embeddings(model: Any, batch: dict[str, torch.Tensor], rows_at_once: int = 16) -> torch.Tensor:
    """The encoder's last hidden states of ``batch``, mean-pooled over each row's real tokens (a sentence encoder's
    usual pooling), in float32 on the CPU: [rows, hidden size]. In evaluation mode (no dropout), restored after."""
    encoder = encoder_of(model)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    pooled = []
    try:
        for start in range(0, batch["input_ids"].shape[0], rows_at_once):
            part = {k: v[start : start + rows_at_once].to(device) for k, v in batch.items()}
            hidden = encoder(**part)[0].float()
            mask = part["attention_mask"].unsqueeze(-1).float()
            pooled.append(((hidden * mask).sum(1) / mask.sum(1).clamp(min=1)).cpu())
    finally:
        model.train(was_training)
    return torch.cat(pooled)


def mean_cosine(before: torch.Tensor, after: torch.Tensor) -> float:
    """The mean, over rows, of the cosine similarity between two [rows, hidden] embeddings of the same texts."""
    return float(torch.nn.functional.cosine_similarity(before, after, dim=-1).mean())
