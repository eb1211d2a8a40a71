"""Packing without cross-document attention (train/model/packing.py), proven on every supported architecture: with the
isolated inputs no document's loss has a gradient on another document's embeddings (exactly zero), each document's
logits in the packed rows are those of the document run alone (positions restart at the model's own offset), and
the plain packed inputs do mix documents (so the zero means something). Tiny models built from configs (two layers,
width 32), as tests/test_head.py. Flash attention's varlen path is taken by a CPU stand-in registered under its own
name: it receives what transformers hands flash attention and attends within the cu_seq_lens segments."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AutoConfig, AutoModelForMaskedLM, DistilBertConfig
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

from train.common.errors import ConfigError
from train.model.head import use_masked_only_head
from train.model.packing import (
    PADDING,
    document_ids_from_lengths,
    isolated_inputs,
    position_ids,
    position_rule,
    prepare_model,
    unsupported_reason,
)

VOCAB = 97
VARLEN_PROBE = "packing_varlen_probe"
VARLEN_CALLS: list[str] = []  # the attention modules that took the probe's varlen path
# By label: model_type and what its config needs to be tiny (test_head.py's, plus the position variants that take
# another path: DeBERTa-v3's relative attention, ESM-2's rotary positions).
ARCHITECTURES = {
    "bert": ("bert", {}),
    "distilbert": ("distilbert", {}),
    "roberta": ("roberta", {}),
    "xlm-roberta": ("xlm-roberta", {}),
    "camembert": ("camembert", {}),
    "electra": ("electra", {"embedding_size": 16}),
    "albert": ("albert", {"embedding_size": 16}),
    "deberta-v2": ("deberta-v2", {}),
    "deberta-v3": (
        "deberta-v2",
        {
            "relative_attention": True,
            "position_biased_input": False,
            "position_buckets": 8,
            "max_relative_positions": 16,
            "pos_att_type": ["p2c", "c2p"],
            "norm_rel_ebd": "layer_norm",
            "share_att_key": True,
        },
    ),
    "modernbert": ("modernbert", {"global_attn_every_n_layers": 2, "local_attention": 8}),  # window 4 < documents
    "mpnet": ("mpnet", {}),
    "esm": ("esm", {"mask_token_id": 4}),
    "esm-rotary": ("esm", {"mask_token_id": 4, "position_embedding_type": "rotary"}),
    "eurobert": ("eurobert", {"num_key_value_heads": 1}),
}
# Two rows of 24: three documents; two and padding. Documents longer than ModernBERT's window, and one of one token.
ROWS = ((5, 12, 6, 1), (14, 4))
LENGTH = 24


def tiny_config(label: str, **extra) -> object:
    kind, values = ARCHITECTURES[label]
    if kind == "distilbert":
        config = DistilBertConfig(
            vocab_size=VOCAB, dim=32, hidden_dim=64, n_layers=2, n_heads=2, max_position_embeddings=64, pad_token_id=0,
        )  # fmt: skip
    else:
        config = AutoConfig.for_model(
            kind, vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=64, pad_token_id=0, **values,
        )  # fmt: skip
    for name, value in vars(config).items():  # no dropout: the packed and the lone runs must compute the same
        if "dropout" in name and isinstance(value, float):
            setattr(config, name, 0.0)
    for name, value in extra.items():
        setattr(config, name, value)
    return config


def tiny(label: str, attn: str, **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(tiny_config(label, **extra), attn_implementation=attn)
    model.train()  # dropout is off; train mode is what the masked-only head and the job run
    return model


def varlen_probe(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None, **kwargs):
    """Flash attention's varlen branch on CPU: with cu_seq_lens the [batch, length] tokens are one flattened
    sequence cut into segments (transformers' _flash_attention_forward); without them, each row's real tokens are.
    ``sliding_window`` as flash attention takes it from ModernBERT: (sliding_window - 1) either side."""
    batch, heads, length, dim = query.shape
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None:
        assert attention_mask is None, "the varlen kwargs go with no mask"
        assert torch.equal(cu, kwargs["cu_seq_lens_k"]) and kwargs["max_length_q"] == int(cu.diff().max())
        VARLEN_CALLS.append(type(module).__name__)
        segments = list(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True))
    else:  # a [batch, length] padding mask (right padding), or none: a row's real tokens are one segment
        real = attention_mask.sum(-1).tolist() if attention_mask is not None else [length] * batch
        segments = [(row * length, row * length + int(n)) for row, n in enumerate(real)]
    groups = heads // key.shape[1]
    q, k, v = (t.transpose(1, 2).reshape(batch * length, -1, dim) for t in (query, key, value))
    out = torch.zeros_like(q)
    for start, end in segments:
        allowed = None
        if sliding_window is not None:
            index = torch.arange(end - start)
            allowed = (index[:, None] - index[None, :]).abs() <= sliding_window - 1
        segment = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1),
            k[start:end].transpose(0, 1).repeat_interleave(groups, dim=0),
            v[start:end].transpose(0, 1).repeat_interleave(groups, dim=0),
            attn_mask=allowed,
            scale=scaling,
        )
        out[start:end] = segment.transpose(0, 1)
    return out.reshape(batch, length, heads, dim), None


@pytest.fixture(scope="module", autouse=True)
def registered_probe():
    AttentionInterface.register(VARLEN_PROBE, varlen_probe)
    ALL_MASK_ATTENTION_FUNCTIONS.register(VARLEN_PROBE, flash_attention_mask)
    yield
    AttentionInterface._global_mapping.pop(VARLEN_PROBE)
    ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.pop(VARLEN_PROBE)


def packed_rows(config) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, slice]]]:
    """Token ids (from 5 up: no special or padding id, not even MPNet's fixed 1), document ids, and where each
    document is: (row, positions)."""
    generator = torch.Generator().manual_seed(1)
    documents = torch.stack([document_ids_from_lengths(lengths, LENGTH) for lengths in ROWS])
    input_ids = torch.randint(5, VOCAB, documents.shape, generator=generator)
    input_ids[documents == PADDING] = config.pad_token_id
    where = []
    for row, lengths in enumerate(ROWS):
        start = 0
        for length in lengths:
            where.append((row, slice(start, start + length)))
            start += length
    return input_ids, documents, where


def cases() -> list[tuple[str, str]]:
    """Every (architecture, implementation) the table says keeps documents apart; flash attention's as the probe."""
    found = []
    for label in ARCHITECTURES:
        config = tiny_config(label)
        for attn in ("sdpa", "eager", "flash_attention_2"):
            if unsupported_reason(config, attn) is None:
                found.append((label, attn))
    return found


def run_as(attn: str) -> str:
    return VARLEN_PROBE if attn.startswith("flash_attention") else attn


def embedding_gradient(model, inputs: dict, labels: torch.Tensor) -> torch.Tensor:
    """d(loss of the labelled tokens) / d(input embeddings), per token: [batch, length]. Taken at the embedding
    layer's output, so every model computes its own positions and embedding path as it would."""
    captured = {}

    def keep(module, args, output):
        output.retain_grad()
        captured["embeddings"] = output

    handle = model.get_input_embeddings().register_forward_hook(keep)
    try:
        model.zero_grad()
        model(**inputs, labels=labels).loss.backward()
    finally:
        handle.remove()
    return captured["embeddings"].grad.abs().sum(dim=-1)


def labels_of(input_ids: torch.Tensor, row: int, span: slice) -> torch.Tensor:
    labels = torch.full_like(input_ids, -100)
    labels[row, span] = input_ids[row, span]
    return labels


@pytest.mark.parametrize(("label", "attn"), cases())
def test_no_document_reaches_another_and_plain_packing_does(label: str, attn: str) -> None:
    model = tiny(label, run_as(attn))
    if attn != "flash_attention_2":  # the probe's name is not in the table; flash attention needs no adaptation
        prepare_model(model)
    input_ids, documents, where = packed_rows(model.config)
    isolated = isolated_inputs(input_ids, documents, model.config, attn_implementation=attn)
    crossing = {"input_ids": input_ids, "attention_mask": (documents != PADDING).long()}

    for row, span in where:
        labels = labels_of(input_ids, row, span)
        own = torch.zeros_like(documents, dtype=torch.bool)
        own[row, span] = True
        isolated_grad = embedding_gradient(model, isolated, labels)
        assert isolated_grad[own].sum() > 0  # the loss does reach its own document
        assert torch.count_nonzero(isolated_grad[~own]) == 0, f"document {row}/{span} reaches another token"
        crossing_grad = embedding_gradient(model, crossing, labels)
        assert torch.count_nonzero(crossing_grad[row][~own[row]]) > 0  # plain packing: the row's others reach it
    if attn == "flash_attention_2":  # every layer's attention took the varlen path (ALBERT: one shared layer)
        VARLEN_CALLS.clear()
        with torch.no_grad():
            model(**isolated)
        assert len(VARLEN_CALLS) == model.config.num_hidden_layers


@pytest.mark.parametrize(("label", "attn"), cases())
def test_each_document_computes_as_if_alone(label: str, attn: str) -> None:
    model = tiny(label, run_as(attn))
    if attn != "flash_attention_2":
        prepare_model(model)
    input_ids, documents, where = packed_rows(model.config)
    with torch.no_grad():
        packed = model(**isolated_inputs(input_ids, documents, model.config, attn_implementation=attn)).logits
        for row, span in where:
            alone_ids = input_ids[row, span].unsqueeze(0)  # its own row, unpadded, the model's own positions
            alone = model(input_ids=alone_ids, attention_mask=torch.ones_like(alone_ids)).logits
            torch.testing.assert_close(packed[row, span], alone[0], rtol=1e-4, atol=1e-5, msg=f"{row}/{span}")
        plain = model(input_ids=input_ids, attention_mask=(documents != PADDING).long()).logits
    row, span = where[1]  # a document that does not start its row: plain packing shifts its positions and context
    assert not torch.allclose(plain[row, span], packed[row, span], rtol=1e-4, atol=1e-5)  # the tolerance tells


@pytest.mark.parametrize(("label", "attn"), cases())
def test_the_masked_only_head_takes_the_isolated_inputs(label: str, attn: str) -> None:
    dense = tiny(label, run_as(attn))
    model = copy.deepcopy(dense)
    use_masked_only_head(model)
    if attn != "flash_attention_2":
        prepare_model(dense)
        prepare_model(model)
    input_ids, documents, where = packed_rows(model.config)
    isolated = isolated_inputs(input_ids, documents, model.config, attn_implementation=attn)
    for row, span in where[:3]:
        labels = labels_of(input_ids, row, span)
        labels[row, span.start + 1 :: 2] = -100  # some of the document's tokens, as masking chooses
        grad = embedding_gradient(model, isolated, labels)
        own = torch.zeros_like(documents, dtype=torch.bool)
        own[row, span] = True
        assert grad[own].sum() > 0 and torch.count_nonzero(grad[~own]) == 0
        alone_ids = input_ids[row, span].unsqueeze(0)
        with torch.no_grad():
            packed_loss = model(**isolated, labels=labels).loss
            alone_loss = model(input_ids=alone_ids, labels=labels[row, span].unsqueeze(0)).loss
            dense_loss = dense(**isolated, labels=labels).loss
        torch.testing.assert_close(packed_loss, alone_loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(packed_loss, dense_loss, rtol=1e-5, atol=1e-6)


def test_positions_restart_at_each_document_at_the_models_offset() -> None:
    documents = torch.tensor([0, 0, 0, 1, 1, 2, PADDING, PADDING])
    bert, roberta, mpnet = tiny_config("bert"), tiny_config("roberta", pad_token_id=1), tiny_config("mpnet")
    assert position_ids(documents, bert).tolist() == [0, 1, 2, 0, 1, 0, 0, 0]
    assert position_ids(documents, roberta).tolist() == [2, 3, 4, 2, 3, 2, 1, 1]  # padding_idx + 1; padding_idx
    assert position_ids(documents, mpnet).tolist() == [2, 3, 4, 2, 3, 2, 1, 1]  # MPNet's fixed padding_idx 1
    assert position_rule(tiny_config("esm")).offset == 1 and position_rule(tiny_config("esm-rotary")).offset == 0
    # A document is a run of one id: the same id again further on is another document, and rows are independent.
    batch = torch.tensor([[0, 0, 1, 0], [5, 5, 5, 5]])
    assert position_ids(batch, bert).tolist() == [[0, 1, 0, 0], [0, 1, 2, 3]]


def test_document_ids_from_lengths() -> None:
    assert document_ids_from_lengths([2, 3], 7).tolist() == [0, 0, 1, 1, 1, PADDING, PADDING]
    with pytest.raises(ValueError, match="do not fit"):
        document_ids_from_lengths([4, 4], 7)


def test_flash_attention_gets_the_document_boundaries_over_the_flattened_batch() -> None:
    documents = torch.tensor([[0, 0, 1, 1, 1, PADDING], [0, 0, 0, 0, 0, 0]])
    inputs = isolated_inputs(torch.ones(2, 6, dtype=torch.long), documents, tiny_config("bert"), "flash_attention_2")
    assert "attention_mask" not in inputs
    assert inputs["cu_seq_lens_q"].tolist() == [0, 2, 5, 6, 12] and inputs["cu_seq_lens_q"].dtype == torch.int32
    assert inputs["max_length_q"] == inputs["max_length_k"] == 6


def test_the_mask_takes_the_form_each_attention_applies() -> None:
    documents = torch.tensor([[0, 0, 1, PADDING]])
    ids = torch.ones(1, 4, dtype=torch.long)
    sdpa = isolated_inputs(ids, documents, tiny_config("bert"), "sdpa")["attention_mask"]
    assert sdpa.dtype == torch.bool and sdpa.shape == (1, 1, 4, 4)
    assert sdpa[0, 0].tolist() == [
        [True, True, False, False],
        [True, True, False, False],
        [False, False, True, False],
        [False, False, False, True],  # padding sees itself only: never an empty softmax row
    ]
    eager = isolated_inputs(ids, documents, tiny_config("bert"), "eager", dtype=torch.bfloat16)["attention_mask"]
    lowest = torch.finfo(torch.bfloat16).min  # what transformers' eager_mask uses: no -inf, no NaN
    assert eager.dtype == torch.bfloat16 and eager[0, 0, 0].tolist() == [0, 0, lowest, lowest]
    assert isolated_inputs(ids, documents, tiny_config("deberta-v2"), "eager")["attention_mask"].dtype == torch.bool
    modernbert = isolated_inputs(ids, documents, tiny_config("modernbert"), "sdpa")["attention_mask"]
    assert set(modernbert) == {"full_attention", "sliding_attention"}


@pytest.mark.parametrize(
    ("label", "attn", "extra", "reason"),
    [
        ("deberta-v2", "sdpa", {}, "deberta-v2 cannot take per-document attention on sdpa"),
        ("mpnet", "flash_attention_2", {}, "mpnet cannot take per-document attention on flash_attention_2"),
        ("bert", "flex_attention", {}, "flex_attention is not supported"),
        ("deberta-v2", "eager", {"conv_kernel_size": 3}, "convolution .* mixes neighbouring tokens"),
        ("esm", "sdpa", {"token_dropout": True}, "token_dropout: .* depend on the others"),
    ],
)
def test_unsupported_combinations_are_refused_with_the_reason(label, attn, extra, reason) -> None:
    config = tiny_config(label, **extra)
    assert unsupported_reason(config, attn) is not None
    with pytest.raises(ValueError, match=reason):
        isolated_inputs(torch.ones(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long), config, attn)


def test_an_unverified_architecture_is_refused() -> None:
    config = AutoConfig.for_model("funnel")
    assert "not one verified" in unsupported_reason(config, "eager")


def test_prepare_model_refuses_before_training() -> None:
    model = tiny("esm", "sdpa", token_dropout=True)
    with pytest.raises(ConfigError, match="packing without cross-document attention: esm with token_dropout"):
        prepare_model(model)


def test_esm_token_dropout_is_refused_because_it_mixes_documents() -> None:
    # The check bypassed, the isolated inputs do not keep ESM's documents apart with token_dropout: a document's
    # embeddings are rescaled by the mask tokens of the whole row.
    model = tiny("esm", "sdpa", token_dropout=True)
    model.config.token_dropout = False  # the module was built with it; only the check is bypassed
    prepare_model(model)
    input_ids, documents, where = packed_rows(model.config)
    input_ids[0, :3] = model.config.mask_token_id  # mask tokens in the first document only
    inputs = isolated_inputs(input_ids, documents, model.config, attn_implementation="sdpa")
    row, span = where[1]
    with torch.no_grad():
        packed = model(**inputs).logits[row, span]
        alone = model(input_ids=input_ids[row, span].unsqueeze(0)).logits[0]
    assert not torch.allclose(packed, alone, atol=1e-4)
