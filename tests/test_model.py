"""The masked-only head (train.model.use_masked_only_head): same loss and gradients as the dense head, and the
saved model stays a standard masked LM. Tiny models built from configs: no hub, no files, about a second."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import (
    AutoModelForMaskedLM,
    BertConfig,
    BertForMaskedLM,
    DistilBertConfig,
    DistilBertForMaskedLM,
    RobertaConfig,
    RobertaForMaskedLM,
)

from train.errors import ConfigError
from train.model import use_masked_only_head

VOCAB = 97


def tiny(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "distilbert":
        # No dropout: the two heads must see the same activations to be compared in training mode.
        config = DistilBertConfig(
            vocab_size=VOCAB, dim=32, hidden_dim=64, n_layers=2, n_heads=2, max_position_embeddings=32,
            dropout=0.0, attention_dropout=0.0, pad_token_id=0,
        )  # fmt: skip
        return DistilBertForMaskedLM(config)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0,
    )  # fmt: skip
    return BertForMaskedLM(config)


def batch(masked_fraction: float = 0.3) -> dict[str, torch.Tensor]:
    """Four rows of different real lengths, padded to 12, with labels at a fraction of the real positions."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(5, VOCAB, (4, 12), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    for row, length in enumerate((12, 9, 5, 7)):
        input_ids[row, length:] = 0
        attention_mask[row, length:] = 0
    chosen = (torch.rand(input_ids.shape, generator=generator) < masked_fraction) & attention_mask.bool()
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, -100))
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def loss_and_grads(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    model.train()
    model.zero_grad()
    loss = model(**inputs).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["distilbert", "bert"])
def test_loss_and_gradients_equal_the_dense_heads(kind):
    dense = tiny(kind)
    sparse = copy.deepcopy(dense)
    use_masked_only_head(sparse)
    inputs = batch()
    assert (inputs["labels"] != -100).sum() > 3  # the comparison means something only with several masked tokens

    dense_loss, dense_grads = loss_and_grads(dense, inputs)
    sparse_loss, sparse_grads = loss_and_grads(sparse, inputs)

    torch.testing.assert_close(sparse_loss, dense_loss, rtol=1e-5, atol=1e-6)
    assert sparse_grads.keys() == dense_grads.keys()
    for name, grad in dense_grads.items():
        torch.testing.assert_close(sparse_grads[name], grad, rtol=1e-4, atol=1e-6, msg=f"gradient of {name}")


def test_the_loss_is_not_just_any_number():
    # Guard against a vacuous comparison: other labels give another loss.
    model = tiny("distilbert")
    use_masked_only_head(model)
    inputs = batch()
    shifted = dict(inputs, labels=torch.where(inputs["labels"] != -100, (inputs["labels"] + 1) % VOCAB, -100))
    assert not torch.isclose(loss_and_grads(model, inputs)[0], loss_and_grads(model, shifted)[0])


def test_training_skips_the_full_logits_and_evaluation_keeps_them():
    model = tiny("distilbert")
    use_masked_only_head(model)
    inputs = batch()
    model.train()
    assert model(**inputs).logits is None  # no [batch, length, vocab] tensor while training
    model.eval()
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (4, 12, VOCAB)


def test_a_batch_without_masked_tokens_gives_zero_loss_not_nan():
    model = tiny("distilbert")
    use_masked_only_head(model)
    inputs = dict(batch(), labels=torch.full((4, 12), -100))
    loss, grads = loss_and_grads(model, inputs)
    assert loss.item() == 0.0
    assert all(torch.count_nonzero(g) == 0 for g in grads.values())


def test_saved_model_is_a_plain_distilbert_masked_lm(tmp_path):
    model = tiny("distilbert")
    use_masked_only_head(model)
    loss_and_grads(model, batch())  # the patched forward has run
    model.save_pretrained(tmp_path)

    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path)
    assert type(loaded) is DistilBertForMaskedLM
    assert loaded.forward.__func__ is DistilBertForMaskedLM.forward
    assert loaded.config.architectures == ["DistilBertForMaskedLM"]
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=0, atol=0, msg=name)
    loaded.train()
    assert loaded(**batch()).logits.shape == (4, 12, VOCAB)  # the standard dense forward


def test_unsupported_architecture_is_a_config_error():
    config = RobertaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )
    with pytest.raises(ConfigError, match="masked_only_head: not supported for RobertaForMaskedLM"):
        use_masked_only_head(RobertaForMaskedLM(config))


def test_a_config_the_model_would_reject_at_its_first_save_is_refused_before_any_data() -> None:
    from train.config import load_config
    from train.model import scratch_config

    # ModernBERT keeps 22 layer_types when num_hidden_layers is overridden after construction: save_pretrained's
    # validation fails, after all the training, unless the built config is validated first.
    config = load_config(
        [], {"MLM_MODEL_NAME_OR_PATH": "scratch:modernbert", "MLM_CONFIG_OVERRIDES": "num_hidden_layers=2"}
    )
    with pytest.raises(ConfigError, match=r"MLM_CONFIG_OVERRIDES: the model rejects this config \(.*layer_types"):
        scratch_config(config)
    fine = load_config([], {"MLM_MODEL_NAME_OR_PATH": "scratch:distilbert", "MLM_CONFIG_OVERRIDES": "n_layers=2"})
    assert scratch_config(fine).n_layers == 2
