"""Averaging models' weights (train/model/average.py, the command: train/commands/average.py): a verified, loadable final/
of the weighted mean; other architectures, shapes or damaged inputs refused in one line, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMaskedLM, DistilBertConfig, DistilBertForMaskedLM

from train.commands import average as command
from train.common.errors import ConfigError
from train.model.average import average, mismatch, normalised
from train.outputs.marker import write_marker


def model_dir(root: Path, name: str, seed: int, dim: int = 32) -> Path:
    torch.manual_seed(seed)
    config = DistilBertConfig(n_layers=1, dim=dim, hidden_dim=64, n_heads=2, vocab_size=50, max_position_embeddings=16)
    directory = root / name
    DistilBertForMaskedLM(config).save_pretrained(directory)
    write_marker(directory)  # as a run's final/ has it
    return directory


def test_the_weighted_mean_of_floats_and_equal_integer_buffers_kept() -> None:
    a = {"w": torch.tensor([1.0, 2.0], dtype=torch.bfloat16), "ids": torch.arange(3)}
    b = {"w": torch.tensor([3.0, 6.0], dtype=torch.bfloat16), "ids": torch.arange(3)}
    out = average([a, b], normalised([1, 3], 2))
    assert out["w"].dtype == torch.bfloat16 and out["w"].tolist() == [2.5, 5.0]
    assert torch.equal(out["ids"], torch.arange(3))
    with pytest.raises(ValueError, match="ids: a tensor of torch.int64 differs"):
        average([a, {**b, "ids": torch.arange(1, 4)}], [0.5, 0.5])
    assert mismatch(["a", "b"], [a, {"w": b["w"]}]) == "b lacks ids: not the same architecture as a"
    assert "is (3,), (2,) in a" in (mismatch(["a", "b"], [a, {**b, "w": torch.zeros(3)}]) or "")
    with pytest.raises(ValueError):
        normalised([1.0], 2)


def test_two_models_average_into_a_final_that_loads_and_verifies(tmp_path: Path) -> None:
    first, second = model_dir(tmp_path, "a", 1), model_dir(tmp_path, "b", 2)
    out = tmp_path / "avg"
    assert command.main([str(first), str(second), "--output_dir", str(out), "--weights", "3,1"]) == 0
    merged = AutoModelForMaskedLM.from_pretrained(out / "final")
    one, two = (AutoModelForMaskedLM.from_pretrained(d) for d in (first, second))
    for (name, p), q, r in zip(merged.named_parameters(), one.parameters(), two.parameters(), strict=True):
        assert torch.allclose(p, 0.75 * q + 0.25 * r, atol=1e-6), name
    assert (out / "final" / "model.safetensors").stat().st_mode & 0o044  # readable as the volume's other files
    from train.outputs.verify import verify

    assert "intact" in verify(out / "final", "final")
    record = json.loads((out / "average.json").read_text())
    assert [m["weight"] for m in record["models"]] == [0.75, 0.25] and record["models"][0]["weights_sha256"]
    assert "# The average of 2 distilbert models" in (out / "final" / "README.md").read_text()


def test_what_cannot_be_averaged_is_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    first = model_dir(tmp_path, "a", 1)
    wider = model_dir(tmp_path, "wide", 2, dim=64)
    out = tmp_path / "avg"
    with pytest.raises(ConfigError, match=r"wide: distilbert.embeddings.LayerNorm.bias is \(64,\), \(32,\) in"):
        command.main([str(first), str(wider), "--output_dir", str(out)])
    damaged = model_dir(tmp_path, "damaged", 3)
    (damaged / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="damaged: config.json"):
        command.main([str(first), str(damaged), "--output_dir", str(out)])
    with pytest.raises(ConfigError, match="give two models or more"):
        command.main([str(first), "--output_dir", str(out)])
    with pytest.raises(ConfigError, match="--weights"):
        command.main([str(first), str(first), "--output_dir", str(out), "--weights", "1,-1"])
    assert not out.exists()
