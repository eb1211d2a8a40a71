"""The masked-only head: the vocabulary projection is computed at masked positions alone, training and evaluating.

A masked-LM's loss only counts the masked positions (15 % of them by default), yet its head projects every
position onto the whole vocabulary: for a BERT-base model the largest matrix product of a step. The rule here is
one for every architecture, not a list of attribute names: a masked-LM model runs its encoder
(``model.base_model``) and then applies its head position by position to the encoder's output. So the encoder's
output is cut to the masked positions on its way to the head, by a forward hook on ``base_model``, and the
model's own forward does the rest (BERT's ``cls``, RoBERTa's and ESM's ``lm_head``, ELECTRA's generator head,
ALBERT's ``predictions``, DeBERTa's ``lm_predictions``, ModernBERT's ``head`` + ``decoder``...).

The loss is the dense head's exactly: cross-entropy averaged over the masked positions, which are the only
positions whose labels are not ignored. Evaluating (labels given, the model in eval mode), the output's ``logits``
are the predicted ids instead, in the labels' shape, IGNORE_INDEX off the masked positions: what the masked-token
accuracy reads (train/run/batches.py), without a [batch, length, vocabulary] tensor that evaluation would
otherwise project every position into and keep. Anything without labels gets the model's own forward and its
logits.
The forward is replaced on this instance only, before DDP wraps it, so gradients still synchronise; the saved
model is the unchanged architecture. What transformers lacks: only ModernBERT has it (``sparse_prediction``).
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from transformers.modeling_outputs import MaskedLMOutput

from train.common.errors import ConfigError, first_line

IGNORE_INDEX = -100


def _cut_to(selected: torch.Tensor) -> Any:
    """A forward hook that hands on only the ``selected`` positions of the encoder's output, as one row."""

    def hook(module: torch.nn.Module, args: Any, output: Any) -> Any:
        hidden = output[0][selected].unsqueeze(0)  # [1, masked positions, hidden size]
        if isinstance(output, tuple):
            return (hidden, *output[1:])
        output[next(iter(output.keys()))] = hidden  # a ModelOutput: its first field is the last hidden state
        return output

    return hook


def use_masked_only_head(model: Any, probe: bool = True) -> None:
    """Train ``model`` with its head applied at masked positions only; ConfigError when its forward does not fit
    the rule (checked now, on a four-token probe, not at the first step). ``probe=False`` for a model without
    storage (train/run/model_setup.py: rank 0 probed the same architecture)."""
    encoder = getattr(model, "base_model", None)
    if encoder is None or encoder is model:
        raise ConfigError(f"masked_only_head: not supported for {type(model).__name__}: it has no base_model")
    dense_forward = model.forward

    def forward(self: Any, input_ids: Any = None, attention_mask: Any = None, labels: Any = None, **kwargs: Any) -> Any:
        if labels is None:
            return dense_forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        selected = labels != IGNORE_INDEX
        handle = encoder.register_forward_hook(_cut_to(selected))
        try:
            logits = dense_forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs).logits
        finally:
            handle.remove()
        logits = logits.reshape(-1, logits.shape[-1])
        if logits.shape[0] != int(selected.sum()):  # the head did not take the encoder's output as it came
            raise ConfigError(f"masked_only_head: not supported for {type(self).__name__}; set it false")
        loss = F.cross_entropy(logits.float(), labels[selected], reduction="sum") / selected.sum().clamp(min=1)
        if self.training:
            return MaskedLMOutput(loss=loss, logits=None)
        predicted = torch.full_like(labels, IGNORE_INDEX)  # evaluating: the ids the accuracy reads, where they count
        predicted[selected] = logits.argmax(dim=-1)
        return MaskedLMOutput(loss=loss, logits=predicted)

    model.forward = types.MethodType(forward, model)
    if probe:
        _probe(model)


def probe_batch(model: Any) -> dict[str, torch.Tensor]:
    """Four tokens, the second one masked: the smallest training batch, on the model's device."""
    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.arange(4).unsqueeze(0) % vocab
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[0, 1] = 1 % vocab
    device = next(model.parameters()).device
    return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device), "labels": labels.to(device)}


def freeze_what_the_loss_never_reaches(model: Any) -> list[str]:
    """Stop training the parameters the masked-LM loss takes no part of (ESM's contact head), and name them.

    DDP waits at every step for a gradient of every trainable parameter: one that never gets one fails the second
    step ("parameters that were not used in producing loss"). Found by one training step's backward on the probe
    batch; frozen, they keep the values they were loaded or built with, and the saved model has them unchanged."""
    was_training = model.training
    model.train()
    try:
        model(**probe_batch(model)).loss.backward()
        unreached = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    freeze(model, unreached)
    return unreached


def freeze(model: Any, names: list[str]) -> None:
    """Stop training the parameters ``names`` (a model without storage takes rank 0's names: its probe cannot run)."""
    frozen = set(names)
    for name, parameter in model.named_parameters():
        if name in frozen:
            parameter.requires_grad_(False)


def _probe(model: Any) -> None:
    """One forward on four tokens with one masked: the rule holds for this model, or the dense head is restored."""
    was_training = model.training
    model.train()
    try:
        with torch.no_grad():
            model(**probe_batch(model))
    except Exception as exc:  # noqa: BLE001 - whatever the model's forward says, the rule does not hold for it
        del model.forward  # the class's own forward again
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(
            f"masked_only_head: not supported for {type(model).__name__} ({type(exc).__name__}: {first_line(exc)})"
        ) from None
    finally:
        model.train(was_training)
