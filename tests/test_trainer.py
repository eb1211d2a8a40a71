"""The Trainer workarounds that can be checked without training: which weights are tied."""

from __future__ import annotations

import torch
from transformers import DistilBertConfig, DistilBertForMaskedLM

from train.trainer import tied_parameter_names


def test_tied_weights_are_named_and_nothing_else() -> None:
    config = DistilBertConfig(n_layers=1, dim=32, hidden_dim=64, n_heads=2, vocab_size=50, max_position_embeddings=16)
    model = DistilBertForMaskedLM(config)
    assert tied_parameter_names(model) == {"distilbert.embeddings.word_embeddings.weight", "vocab_projector.weight"}
    assert tied_parameter_names(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))) == set()
