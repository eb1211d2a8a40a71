"""A model directory someone handed over is data: pickled weights whose loading would run code are refused with
one line saying how to convert them, and a model's own code (``auto_map``) never runs unless
MLM_TRUST_REMOTE_CODE=true. Each payload would create a file if it ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

from tests.helpers import Payload
from train.common.errors import ConfigError
from train.config import load_config
from train.doctor.sources import check_model
from train.model.load import CONVERT, check_before_data, load_model, refuse_unsafe_weights


def tiny_model() -> BertForMaskedLM:
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    return BertForMaskedLM(config)


def config_for(model: Path, **env: str):
    return load_config([], {"MLM_MODEL_NAME_OR_PATH": str(model), **{f"MLM_{k.upper()}": v for k, v in env.items()}})


def test_pickled_weights_with_a_payload_are_refused_and_nothing_runs(tmp_path: Path) -> None:
    model, ran = tmp_path / "model", tmp_path / "ran"
    tiny_model().save_pretrained(model)
    state = dict(tiny_model().state_dict())
    (model / "model.safetensors").unlink()
    torch.save({**state, "extra": Payload(ran)}, model / "pytorch_model.bin")
    config = config_for(model)
    with pytest.raises(ConfigError, match=r"pytorch_model.bin: fails the safe load .*convert them to safetensors"):
        refuse_unsafe_weights(config.model, model)
    with pytest.raises(ConfigError, match=r"MLM_MODEL_NAME_OR_PATH=.*pytorch_model.bin: fails the safe load"):
        load_model(config.model, config.data, None, None)
    with pytest.raises(ConfigError, match=r"pytorch_model.bin: fails the safe load"):
        check_before_data(config.model, config.data, None)  # the job refuses before it reads or tokenizes any data
    row = check_model(config.model, {})
    assert (row.status, row.fix) == ("FAIL", CONVERT)
    assert row.detail.startswith(f"{model}/pytorch_model.bin: fails the safe load")
    assert not ran.exists()


def test_plain_pickled_weights_still_load_the_safe_way(tmp_path: Path) -> None:
    model = tmp_path / "model"
    tiny_model().save_pretrained(model)
    (model / "model.safetensors").unlink()
    torch.save(dict(tiny_model().state_dict()), model / "pytorch_model.bin")
    refuse_unsafe_weights(config_for(model).model, model)  # tensors only: nothing to refuse


def test_a_models_own_code_never_runs_without_trust_remote_code(tmp_path: Path) -> None:
    model, ran = tmp_path / "model", tmp_path / "ran"
    tiny_model().save_pretrained(model)
    values = json.loads((model / "config.json").read_text())
    values["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForMaskedLM": "evil.EvilModel"}
    (model / "config.json").write_text(json.dumps(values))
    (model / "evil.py").write_text(f"from pathlib import Path\nPath({str(ran)!r}).touch()\n")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(59)]]))
    tokenizer = BertTokenizerFast(vocab_file=str(vocab))
    config = config_for(model)
    loaded, _ = load_model(config.model, config.data, None, tokenizer)
    assert type(loaded).__name__ == "BertForMaskedLM"  # the library's class, not the directory's code
    assert not ran.exists()
