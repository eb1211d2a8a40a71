"""train/run/build.py's prepare: what a rank trains with, and bad input refused before the resume choice (so that
it leaves output_dir as it was)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import demo_config
from train.common.errors import ConfigError
from train.data.identity import data_identity
from train.outputs.checkpoints import DATA_IDENTITY, resumed_options
from train.outputs.marker import mark_complete
from train.outputs.runfiles import RunFiles
from train.run.build import prepare
from train.run.callbacks import CheckpointCompleteMarker
from train.run.resuming import resumed_data

TINY = "n_layers=1,n_heads=2,dim=16,hidden_dim=32"


def tiny(tmp_path: Path, **env: str):
    """The demo corpus and a one-layer DistilBERT from scratch, its cache and outputs under ``tmp_path``."""
    options = {
        "model_name_or_path": "scratch:distilbert",
        "config_overrides": TINY,
        "output_dir": str(tmp_path / "out"),
        "max_steps": "2",
        **env,
    }
    return demo_config(**options)


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


def test_prepare_builds_the_rank_and_asks_for_the_resume_once_the_input_is_checked(tmp_path: Path) -> None:
    config = tiny(tmp_path)
    files = RunFiles(config.training.output_dir)
    asked: list[str] = []

    def choose_resume() -> str | None:
        asked.append("resume")
        return None

    prepared = prepare(config, files, choose_resume)
    assert asked == ["resume"] and prepared.resume is None
    assert prepared.head == "masked-only" and prepared.corpus.train_samples and prepared.corpus.eval_samples
    assert prepared.packing.padding == config.data.padding and 0 < prepared.packing.efficiency <= 1
    assert prepared.masking.mlm_probability == config.masking.mlm_probability
    markers = [c for c in prepared.trainer.callback_handler.callbacks if isinstance(c, CheckpointCompleteMarker)]
    assert [marker.files for marker in markers] == [files]  # the run's files, handed down, not rebuilt
    facts = prepared.facts()
    assert facts.dataset_fingerprint == prepared.corpus.fingerprint and facts.model.head == "masked-only"
    assert facts.data_identity == {"demo": {"samples": config.data.demo_samples}} and markers[0].options[DATA_IDENTITY]


def test_bad_input_is_refused_before_the_resume_is_chosen(tmp_path: Path) -> None:
    asked: list[str] = []
    bad_model = tiny(tmp_path, config_overrides="n_layers=1,no_such_field=3")
    with pytest.raises(ConfigError, match="no_such_field"):
        prepare(bad_model, RunFiles(bad_model.training.output_dir), lambda: asked.append("resume") or None)
    missing_data = tiny(tmp_path, dataset=str(tmp_path / "no-such-file.txt"))
    with pytest.raises(ConfigError, match="no-such-file.txt"):
        prepare(missing_data, RunFiles(missing_data.training.output_dir), lambda: asked.append("resume") or None)
    assert asked == []  # the choice (which moves damaged checkpoints aside) never ran


def test_a_resume_on_data_that_changed_since_its_checkpoint_is_refused_unless_asked_for(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i}\n" for i in range(100)))
    config = tiny(tmp_path, dataset=str(corpus))
    checkpoint = RunFiles(config.training.output_dir).checkpoint(10)
    checkpoint.mkdir(parents=True)
    recorded = resumed_options(config.as_dict(), config.training.world_size)
    mark_complete(checkpoint, {**recorded, DATA_IDENTITY: data_identity(config.data, "fp")})
    assert resumed_data(config.checkpoint, checkpoint, data_identity(config.data, "fp")) is None
    corpus.write_text("".join(f"line {i}\n" for i in range(101)))  # replaced in place between a stop and its resume
    now = data_identity(config.data, "fp")
    with pytest.raises(
        ConfigError, match=r"^checkpoint-10 was saved while training on other data \(corpus.txt: 799 bytes"
    ):
        resumed_data(config.checkpoint, checkpoint, now)
    told = tiny(tmp_path, dataset=str(corpus), resume_on_changed_data="true")
    assert resumed_data(told.checkpoint, checkpoint, now)[0].startswith("corpus.txt: 799 bytes")
    mark_complete(checkpoint, recorded)  # a checkpoint without the record: nothing to compare
    assert resumed_data(config.checkpoint, checkpoint, now) is None
