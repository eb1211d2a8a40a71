"""What a model name is (train/config/model_source.py): one rule that the job's loader, doctor and the model card share,
so a directory holding only a config.json is trained from scratch everywhere, not only in the loader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from train.common.errors import ConfigError
from train.config import load_config
from train.config.model_source import SHARDED_WEIGHTS, model_source
from train.doctor.sources import check_model
from train.model.load import scratch_config
from train.publish.card import model_card


def architecture(directory: Path, *, weights: bool = False) -> Path:
    """A directory with a BERT config.json, and model weights when ``weights``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "bert", "num_hidden_layers": 2}))
    if weights:
        (directory / "model.safetensors").write_bytes(b"")
    return directory


def test_scratch_type_is_an_architecture_shaped_by_the_overrides() -> None:
    source = model_source("scratch:bert", "num_hidden_layers=2")
    assert (source.kind, source.model_type, source.path, source.pretrained) == ("scratch", "bert", None, False)
    assert source.config_values("MLM_MODEL_NAME_OR_PATH") == {"model_type": "bert"}
    assert source.description == "scratch:bert (num_hidden_layers=2), trained from scratch"


def test_a_directory_holding_only_a_config_is_trained_from_scratch(tmp_path: Path) -> None:
    source = model_source(str(architecture(tmp_path / "arch")))
    assert source.kind == "scratch" and source.config_file == tmp_path / "arch" / "config.json"
    assert source.config_values("L")["num_hidden_layers"] == 2
    assert source.description.endswith("(config.json only, no weights), trained from scratch")


def test_a_config_json_file_is_trained_from_scratch(tmp_path: Path) -> None:
    config_file = architecture(tmp_path / "arch") / "config.json"
    source = model_source(str(config_file))
    assert source.kind == "scratch" and source.config_file == config_file
    assert source.description == f"{config_file}, trained from scratch"


def test_a_directory_with_weights_is_a_local_pretrained_model(tmp_path: Path) -> None:
    source = model_source(str(architecture(tmp_path / "model", weights=True)), "num_hidden_layers=2")
    assert source.kind == "local" and source.pretrained and source.path == tmp_path / "model"
    assert "from its pretrained weights in a local directory" in source.description
    assert "config_overrides ignored" in source.description  # the loader never applies them to a pretrained model
    with pytest.raises(ValueError, match="pretrained model, not an architecture"):
        source.config_values("L")


@pytest.mark.parametrize("name", ["distilbert-base-uncased", "org/model", "answerdotai/ModernBERT-base"])
def test_a_name_that_is_not_local_is_a_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.chdir(tmp_path)  # nothing of that name here
    source = model_source(name)
    assert (source.kind, source.name, source.path) == ("hub", name, None)
    assert source.description == f"{name}, from its pretrained weights on the hub"


def test_relative_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # ./relative is local before it exists (the loader then says it is missing) ...
    assert model_source("./relative").kind == "local"
    # ... and relative/ or org/model once a directory of that name is here, as from_pretrained would read it.
    architecture(tmp_path / "relative")
    assert model_source("relative/").kind == "scratch" and model_source("./relative").kind == "scratch"
    architecture(tmp_path / "org" / "model", weights=True)
    assert model_source("org/model").kind == "local"


def test_home_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert model_source("~/models/m").kind == "local"  # missing, but a path: never a hub id
    architecture(tmp_path / "models" / "m")
    source = model_source("~/models/m")
    assert source.kind == "scratch" and source.config_file == tmp_path / "models" / "m" / "config.json"


@pytest.mark.parametrize("weights", [False, True])
def test_the_loader_doctor_and_card_agree(tmp_path: Path, weights: bool) -> None:
    """What each of them says of the same directory: built from scratch only when it holds no weights."""
    directory = architecture(tmp_path / "m", weights=weights)
    config = load_config([], {"MLM_MODEL_NAME_OR_PATH": str(directory), "MLM_OUTPUT_DIR": str(tmp_path / "out")})
    built = scratch_config(config.model)
    row = check_model(config.model, {"HF_HOME": str(tmp_path / "hf")})
    card = model_card(config.as_dict(), config.sources, {}, {}, step=1)
    assert row.status == "OK"
    if weights:
        assert built is None
        assert "trained from scratch" not in row.detail and "trained from scratch" not in card
    else:
        assert built.num_hidden_layers == 2
        assert "trained from scratch" in row.detail and f"`{directory} (config.json only" in card
    assert "base_model" not in card.split("---")[1]  # a local model is nobody's hub base model


def test_a_missing_local_model_or_a_config_without_a_type_fails_in_the_loader_and_doctor(tmp_path: Path) -> None:
    (tmp_path / "untyped").mkdir()
    (tmp_path / "untyped" / "config.json").write_text("{}")
    for name, said in [(tmp_path / "missing", "no such local model directory"), (tmp_path / "untyped", "model_type")]:
        config = load_config([], {"MLM_MODEL_NAME_OR_PATH": str(name)})
        with pytest.raises(ConfigError, match=said):
            scratch_config(config.model)
        row = check_model(config.model, {})
        assert row.status == "FAIL" and said in row.detail


def test_a_sharded_checkpoint_is_not_an_architecture_and_the_loader_says_what_it_is(tmp_path: Path) -> None:
    """An fsdp checkpoint holds a config.json and its weights as shards (model_dcp/): trained from scratch, it
    would silently drop the weights."""
    checkpoint = architecture(tmp_path / "checkpoint-10")
    (checkpoint / SHARDED_WEIGHTS).mkdir()
    assert model_source(str(checkpoint)).kind == "local"
    config = load_config([], {"MLM_MODEL_NAME_OR_PATH": str(checkpoint)})
    with pytest.raises(ConfigError, match=r"MLM_MODEL_NAME_OR_PATH=.*checkpoint-10.*not a model; resume it"):
        scratch_config(config.model)
