"""What a pretrained model's weights hold of its MLM head (train/model/weights.py), said in our words, before
loading (doctor) and when loading (the job), with transformers' fine-tuning load report kept off the console."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from transformers import BertConfig, BertForMaskedLM, BertModel, BertTokenizerFast

from train.config import load_config
from train.doctor.sources import check_model
from train.model.load import load_model
from train.model.weights import HEAD_NEW, head_state_before_loading

SIZES = {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}


def tokenizer(tmp_path: Path) -> BertTokenizerFast:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(59)]]))
    return BertTokenizerFast(vocab_file=str(vocab))


def saved(directory: Path, model) -> Path:
    model.save_pretrained(directory)
    return directory


def load(directory: Path, tmp_path: Path):
    config = load_config([], {"MLM_MODEL_NAME_OR_PATH": str(directory)})
    return load_model(config.model, config.data, None, tokenizer(tmp_path))[1]


def test_an_encoder_saved_without_its_head_is_said_new_before_and_when_loading(tmp_path, capfd):
    encoder = saved(tmp_path / "encoder", BertModel(BertConfig(**SIZES)))  # as sentence-transformers saves one
    assert head_state_before_loading(str(encoder)) == HEAD_NEW
    assert load(encoder, tmp_path) == HEAD_NEW
    said = capfd.readouterr().err
    assert "seem corrupted" not in said and "LOAD REPORT" not in said and "\x1b[" not in said
    row = check_model(load_config([], {"MLM_MODEL_NAME_OR_PATH": str(encoder)}).model, {})
    assert row.status == "OK" and row.detail.endswith(f"; its MLM head is {HEAD_NEW}")


def test_a_whole_mlm_model_says_nothing_and_a_partial_head_is_named(tmp_path):
    whole = saved(tmp_path / "whole", BertForMaskedLM(BertConfig(**SIZES)))
    assert head_state_before_loading(str(whole)) is None and load(whole, tmp_path) is None
    weights = whole / "model.safetensors"
    tensors = {k: v for k, v in load_file(weights).items() if not k.startswith("cls.predictions.transform.dense")}
    save_file(tensors, str(weights), metadata={"format": "pt"})
    expected = "partly new: 2 of its 5 tensors initialised randomly (cls.predictions.transform.dense.bias, "
    assert (head_state_before_loading(str(whole)) or "").startswith(expected)
    assert (load(whole, tmp_path) or "").startswith(expected)


@pytest.mark.parametrize("name", ["no/such/model-anywhere", "scratch:bert"])
def test_nothing_is_said_of_a_model_that_is_not_here(name):
    assert head_state_before_loading(name) is None
