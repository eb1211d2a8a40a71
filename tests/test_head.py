"""The masked-only head (train/model/head.py), one rule for every architecture: the same loss and gradients as the
model's dense head, no [batch, length, vocab] logits while training or evaluating, the same predictions at the
masked positions, and the saved model a standard masked LM.
Tiny models built from configs (two layers, width 32): no hub, no files, about a second each."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForMaskedLM, DistilBertForMaskedLM

from tools.models import ARCHITECTURES, VOCAB, tiny_config
from train.common.errors import ConfigError
from train.model.head import use_masked_only_head


def tiny(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = tiny_config(kind)
    for name, value in vars(config).items():  # no dropout: the two heads must see the same activations
        if "dropout" in name and isinstance(value, float):
            setattr(config, name, 0.0)
    return AutoModelForMaskedLM.from_config(config)


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


@pytest.mark.parametrize("kind", ARCHITECTURES)
def test_loss_and_gradients_equal_the_dense_heads(kind: str) -> None:
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
    sparse.train()
    assert sparse(**inputs).logits is None  # no [batch, length, vocab] tensor while training


def test_the_loss_is_not_just_any_number() -> None:
    # Guard against a vacuous comparison: other labels give another loss.
    model = tiny("roberta")
    use_masked_only_head(model)
    inputs = batch()
    shifted = dict(inputs, labels=torch.where(inputs["labels"] != -100, (inputs["labels"] + 1) % VOCAB, -100))
    assert not torch.isclose(loss_and_grads(model, inputs)[0], loss_and_grads(model, shifted)[0])


@pytest.mark.parametrize("kind", ARCHITECTURES)
def test_evaluation_at_masked_positions_gives_the_dense_heads_loss_and_predictions(kind: str) -> None:
    """Evaluating, the head projects the masked positions alone: the dense head's loss, and its argmax at exactly
    the masked positions (what the masked-token accuracy reads), IGNORE_INDEX elsewhere."""
    dense = tiny(kind)
    sparse = copy.deepcopy(dense)
    use_masked_only_head(sparse)
    dense.eval()
    sparse.eval()
    inputs = batch()
    masked = inputs["labels"] != -100
    with torch.no_grad():
        expected, got = dense(**inputs), sparse(**inputs)
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=1e-6)
    assert got.logits.shape == inputs["labels"].shape and not got.logits.is_floating_point()
    assert torch.equal(got.logits[masked], expected.logits.argmax(dim=-1)[masked])
    assert (got.logits[~masked] == -100).all()


def test_without_labels_the_model_gives_every_positions_logits() -> None:
    model = tiny("distilbert")
    use_masked_only_head(model)
    model.eval()
    unlabelled = {k: v for k, v in batch().items() if k != "labels"}
    with torch.no_grad():
        assert model(**unlabelled).logits.shape == (4, 12, VOCAB)


def test_a_batch_without_masked_tokens_gives_zero_loss_not_nan() -> None:
    model = tiny("bert")
    use_masked_only_head(model)
    inputs = dict(batch(), labels=torch.full((4, 12), -100))
    loss, grads = loss_and_grads(model, inputs)
    assert loss.item() == 0.0
    assert all(torch.count_nonzero(g) == 0 for g in grads.values())


def test_saved_model_is_a_plain_masked_lm(tmp_path) -> None:
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


class WholeSequenceHead(torch.nn.Module):
    """A model whose head is not applied position by position: the rule cannot hold, the probe says so."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Embedding(VOCAB, 8)
        self.head = torch.nn.Linear(8, VOCAB)

    @property
    def base_model(self) -> torch.nn.Module:
        return self.encoder

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.encoder

    def forward(self, input_ids=None, attention_mask=None, labels=None):  # noqa: ANN001, ANN201
        from transformers.modeling_outputs import MaskedLMOutput

        hidden = self.encoder(input_ids)
        return MaskedLMOutput(logits=self.head(hidden.mean(dim=1, keepdim=True)).expand(-1, input_ids.shape[1], -1))


def test_a_model_the_rule_does_not_fit_is_refused_before_training_and_keeps_its_dense_head() -> None:
    model = WholeSequenceHead()
    with pytest.raises(ConfigError, match="masked_only_head: not supported for WholeSequenceHead"):
        use_masked_only_head(model)
    assert "forward" not in vars(model)  # the class's own forward again


def test_parameters_the_loss_never_reaches_are_frozen_and_named() -> None:
    from train.model.head import freeze_what_the_loss_never_reaches

    esm = tiny("esm")
    use_masked_only_head(esm)
    unreached = freeze_what_the_loss_never_reaches(esm)
    assert unreached and all(name.startswith("esm.contact_head.") for name in unreached)
    assert not any(p.requires_grad for n, p in esm.named_parameters() if n in unreached)
    assert all(p.grad is None for p in esm.parameters())  # the probe leaves no gradient behind
    assert freeze_what_the_loss_never_reaches(tiny("bert")) == []
