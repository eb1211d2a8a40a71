"""Packing without cross-document attention: what the model is handed so that a packed row's documents stay apart.

Plain packing (train/data/tokenization.py, run_mlm.py's group_texts) concatenates documents and cuts blocks: every
token attends to the whole block and positions run on across document boundaries. Here each token carries the id
of its document within its row (``document_ids``, :data:`PADDING` for padding), and from that come

- position ids that restart at every document, at the model's own first position (:func:`position_rule`);
- the attention, block-diagonal per document, in the form the attention implementation takes
  (:func:`isolated_inputs`): a 4D ``[batch, 1, query, key]`` mask for SDPA (bool) and eager (additive float, or bool
  for DeBERTa), which transformers 5.x's ``create_bidirectional_mask`` hands to the attention as it is (its
  documented contract: "an already prepared 4D mask ... in which case it is returned as-is"); for flash
  attention no mask but the varlen path's ``cu_seq_lens_q/k`` and ``max_length_q/k`` (``FlashAttentionKwargs``),
  which the model passes through ``**kwargs`` to ``_flash_attention_forward`` and which take precedence there over
  inferring boundaries from position ids (that inference only runs for a batch of one row).

Padding tokens see only themselves and no token sees them (no all-masked softmax row, so no NaN on any SDPA
kernel). Which architectures can be given per-document boundaries, on which implementation, is one table
(:func:`unsupported_reason`); :func:`prepare_model` checks the loaded model against it and adapts the two whose
embedding layer also reads the attention mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING

from train.borrowed.transformers_models import attn_implementation as attn_implementation_of
from train.borrowed.transformers_models import supports_sdpa
from train.common.errors import ConfigError

PADDING = -1  # the document id of padding tokens

# Per model type, the attention implementations verified (tests/test_packing.py) to keep documents apart with the
# inputs built here. transformers 5.25 source, models/<type>/modeling_<type>.py: every one of these builds its
# mask with create_bidirectional_mask (a 4D mask passes as is) and passes **kwargs down to the attention function,
# except where noted.
_VARLEN = ("flash_attention_2", "flash_attention_3", "flash_attention_4")
_ALL = ("sdpa", "eager", *_VARLEN)
SUPPORTED: dict[str, tuple[str, ...]] = {
    "bert": _ALL,
    "roberta": _ALL,
    "xlm-roberta": _ALL,
    "camembert": _ALL,
    "electra": _ALL,
    "albert": _ALL,
    "distilbert": _ALL,
    "eurobert": _ALL,
    # Sliding-window layers: its forward takes a {"full_attention", "sliding_attention"} dict of masks; a single
    # 4D mask would be used as is by both and lose the window.
    "modernbert": _ALL,
    # EsmModel hands attention_mask to EsmEmbeddings, which multiplies by it as [batch, length]: prepare_model
    # takes a 4D mask away from the embeddings (flash attention needs no mask, so no adaptation).
    "esm": _ALL,
    # No SDPA or flash attention in transformers (MPNetPreTrainedModel declares neither); its relative position
    # bias is computed from index differences (MPNetEncoder.compute_position_bias), the same inside a document.
    "mpnet": ("eager",),
    # Eager only (no _supports_sdpa/_supports_flash_attn). Its attention masks with attention_mask.bool(), so the
    # mask is bool; DebertaV2Model also passes the mask to DebertaV2Embeddings (adapted by prepare_model).
    # Relative positions come from index differences (build_relative_position), the same inside a document.
    "deberta-v2": ("eager",),
}
_EMBEDDINGS_READ_THE_MASK = {"esm": "attention_mask", "deberta-v2": "mask"}  # keyword the model calls them with


@dataclass(frozen=True)
class PositionRule:
    """A document's first position id (``offset``) and the position id padding tokens get."""

    offset: int
    padding: int


def position_rule(config: Any) -> PositionRule:
    """Where the model's positions start, decided once from its type, as its own forward counts them when it is
    given no position_ids (so that a document in a packed row sees the positions it would see alone):

    - RoBERTa family (roberta, xlm-roberta, camembert) and ESM with absolute positions: ``padding_idx + 1``, padding
      at ``padding_idx`` (``create_position_ids_from_input_ids``, fairseq's ``make_positions``), with padding_idx
      the config's ``pad_token_id``;
    - MPNet: 2, padding at 1: ``MPNetEmbeddings`` hard-codes ``padding_idx = 1`` whatever the config says;
    - ESM with rotary positions: 0, ``EsmModel.forward``'s ``arange`` (its embeddings then add no positions);
    - all the others (BERT, DistilBERT, ELECTRA, ALBERT, DeBERTa-v2, ModernBERT, EuroBERT): 0, from a buffer
      ``arange`` (absolute) or an ``arange`` for the rotary embedding; padding at 0.
    """
    kind = config.model_type
    if kind in ("roberta", "xlm-roberta", "camembert") or (
        kind == "esm" and getattr(config, "position_embedding_type", "absolute") == "absolute"
    ):
        return PositionRule(offset=config.pad_token_id + 1, padding=config.pad_token_id)
    if kind == "mpnet":
        return PositionRule(offset=2, padding=1)
    return PositionRule(offset=0, padding=0)


def document_ids_from_lengths(lengths: Sequence[int], length: int) -> torch.Tensor:
    """One row's per-token document ids, ``[length]``, from its documents' lengths in order; the rest padding."""
    if sum(lengths) > length:
        raise ValueError(f"documents of {sum(lengths)} tokens do not fit a {length}-token row")
    ids = torch.full((length,), PADDING, dtype=torch.long)
    counts = torch.as_tensor(lengths, dtype=torch.long)
    ids[: sum(lengths)] = torch.repeat_interleave(torch.arange(len(lengths)), counts)
    return ids


def _rows(document_ids: torch.Tensor) -> torch.Tensor:
    if document_ids.dim() not in (1, 2):
        raise ValueError(f"document_ids: expected [length] or [batch, length], got {tuple(document_ids.shape)}")
    return document_ids if document_ids.dim() == 2 else document_ids.unsqueeze(0)


def _starts(document_ids: torch.Tensor) -> torch.Tensor:
    """[batch, length] bool: True where a run of one document id begins (every row's first token included). A
    document is a run: consecutive tokens with one id, so the same id further on would be another document."""
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    return starts


def position_ids(document_ids: torch.Tensor, config: Any) -> torch.Tensor:
    """Position ids restarting at every document at the model's offset (:func:`position_rule`); the shape of
    ``document_ids`` (``[length]`` for one row or ``[batch, length]``)."""
    rows = _rows(document_ids)
    rule = position_rule(config)
    index = torch.arange(rows.shape[1], device=rows.device).expand_as(rows)
    start = torch.where(_starts(rows), index, 0).cummax(dim=1).values  # each token's run start
    positions = torch.where(rows == PADDING, rule.padding, index - start + rule.offset)
    return positions.reshape(document_ids.shape)


def block_mask(document_ids: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """``[batch, 1, length, length]`` bool, True where query i may attend to key j: the same document and j not
    padding, and ``|i - j| <= window`` for a sliding-window layer; every token attends to itself, so that a padding
    query's softmax row is never empty."""
    rows = _rows(document_ids)
    length = rows.shape[1]
    allowed = (rows[:, :, None] == rows[:, None, :]) & (rows != PADDING)[:, None, :]
    allowed |= torch.eye(length, dtype=torch.bool, device=rows.device)
    if window is not None:
        index = torch.arange(length, device=rows.device)
        allowed &= (index[:, None] - index[None, :]).abs() <= window
    return allowed.unsqueeze(1)


def _form(allowed: torch.Tensor, form: str, dtype: torch.dtype) -> torch.Tensor:
    if form == "bool":
        return allowed
    # What transformers' eager_mask gives: 0 where attended, the dtype's minimum (not -inf: no NaN) elsewhere.
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


def varlen_kwargs(document_ids: torch.Tensor) -> dict[str, Any]:
    """The flash-attention varlen path's ``FlashAttentionKwargs``: cumulative document boundaries over the batch's
    flattened tokens (``_flash_attention_forward`` flattens [batch, length] to one sequence when they are given),
    int32 as flash-attn takes them; a row's padding is one more segment, that no document sees."""
    rows = _rows(document_ids)
    starts = _starts(rows).reshape(-1).nonzero().reshape(-1)
    total = torch.tensor([rows.numel()], dtype=starts.dtype, device=starts.device)
    cu_seq_lens = torch.cat([starts, total]).to(torch.int32)
    longest = int(cu_seq_lens.diff().max())
    return {
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
        "max_length_q": longest,
        "max_length_k": longest,
    }


def _implementation(config: Any, attn_implementation: str | None) -> str:
    """The implementation the model runs: the one asked for, else the config's, else transformers' default
    (SDPA where the masked-LM class has it, eager where not)."""
    chosen = attn_implementation or attn_implementation_of(config)
    if chosen:
        return chosen
    model_class = MODEL_FOR_MASKED_LM_MAPPING.get(type(config), None)
    return "sdpa" if supports_sdpa(model_class) else "eager"


def unsupported_reason(config: Any, attn_implementation: str | None = None) -> str | None:
    """None when ``config``'s architecture keeps documents apart on ``attn_implementation`` (default: the one the
    model would run) with the inputs built here; else why not, one line, to refuse before tokenizing."""
    kind = getattr(config, "model_type", None)
    attn = _implementation(config, attn_implementation)
    if kind not in SUPPORTED:
        verified = ", ".join(SUPPORTED)
        return f"model type {kind!r} is not one verified to take per-document attention (verified: {verified})"
    if attn == "flex_attention":
        return (
            "flex_attention is not supported for it: torch has no flex attention backward on CPU, and BERT-style "
            "attention refuses attention dropout under flex; use sdpa (the same per-document mask)"
        )
    if attn not in SUPPORTED[kind]:
        return f"{kind} cannot take per-document attention on {attn} (possible: {', '.join(SUPPORTED[kind])})"
    if kind == "deberta-v2" and getattr(config, "conv_kernel_size", 0) > 0:
        return (
            f"deberta-v2 with conv_kernel_size={config.conv_kernel_size}: its convolution (DebertaV2Encoder.conv) "
            "mixes neighbouring tokens across document boundaries and takes no 4D mask"
        )
    if kind == "esm" and getattr(config, "token_dropout", False):
        return (
            "esm with token_dropout: EsmEmbeddings rescales a row's embeddings by the fraction of mask tokens in the "
            "whole row, so each document's embeddings depend on the others'"
        )
    return None


def prepare_model(model: Any) -> None:
    """Check ``model`` (loaded, its attention implementation chosen) against :func:`unsupported_reason`
    (ConfigError if it cannot keep documents apart), and where its embedding layer reads the attention mask as
    ``[batch, length]`` (ESM, DeBERTa-v2) take a 4D mask away from it: the layer only zeroes padding embeddings
    with it, which no document attends to anyway. The model's weights and forward are unchanged; idempotent."""
    config = model.config
    reason = unsupported_reason(config, attn_implementation_of(config))
    if reason is not None:
        raise ConfigError(f"packing without cross-document attention: {reason}")
    keyword = _EMBEDDINGS_READ_THE_MASK.get(config.model_type)
    embeddings = getattr(model.base_model, "embeddings", None)
    if keyword is None or embeddings is None or getattr(embeddings, "mlm_packing_hook", False):
        return

    def no_4d_mask(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        mask = kwargs.get(keyword)
        if isinstance(mask, torch.Tensor) and mask.dim() == 4:
            kwargs[keyword] = None
        return args, kwargs

    embeddings.register_forward_pre_hook(no_4d_mask, with_kwargs=True)
    embeddings.mlm_packing_hook = True  # our mark: hooked once


def mask_form(config: Any, attn_implementation: str | None = None) -> str:
    """``bool`` or ``additive``: what the attention adds or applies. SDPA takes either (bool: True = attend);
    the eager attentions add the mask to the scores (``attn_weights + attention_mask``), except DeBERTa-v2's,
    which applies ``attention_mask.bool()``."""
    attn = _implementation(config, attn_implementation)
    return "additive" if attn == "eager" and config.model_type != "deberta-v2" else "bool"


def isolated_inputs(
    input_ids: torch.Tensor,
    document_ids: torch.Tensor,
    config: Any,
    attn_implementation: str | None = None,
    dtype: torch.dtype = torch.float32,
) -> dict[str, Any]:
    """What to hand the model for packed ``[batch, length]`` rows so that no document sees another: input_ids,
    position_ids and, by implementation, a 4D ``attention_mask`` (a dict of them for ModernBERT's two layer kinds)
    or, for flash attention, no mask (no key) but the varlen kwargs. ``dtype``: the additive mask's, the model's compute
    dtype (eager adds it to the scores). ValueError when the combination is unsupported (see
    :func:`unsupported_reason`, which the job asks first)."""
    attn = _implementation(config, attn_implementation)
    reason = unsupported_reason(config, attn)
    if reason is not None:
        raise ValueError(reason)
    document_ids = _rows(document_ids)
    if input_ids.shape != document_ids.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and document_ids {tuple(document_ids.shape)} differ")
    inputs: dict[str, Any] = {"input_ids": input_ids, "position_ids": position_ids(document_ids, config)}
    if attn in _VARLEN:
        # No attention_mask key at all: the Trainer's token count reads inputs["attention_mask"] when the key is there.
        return {**inputs, **varlen_kwargs(document_ids)}
    form = mask_form(config, attn)
    mask = _form(block_mask(document_ids), form, dtype)
    if config.model_type == "modernbert":
        window = _form(block_mask(document_ids, window=config.sliding_window), form, dtype)
        return {**inputs, "attention_mask": {"full_attention": mask, "sliding_attention": window}}
    return {**inputs, "attention_mask": mask}
