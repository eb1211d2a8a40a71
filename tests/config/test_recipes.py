"""Recipes (train/config/recipes.py): what a run gets for the options it leaves unset, and the decay's steps
(train/common/schedules.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from train.common.errors import ConfigError
from train.common.schedules import scheduler_kwargs
from train.config import load_config
from train.config.recipes import RECIPES


def test_a_model_trained_from_scratch_gets_the_modern_recipe_and_says_so() -> None:
    config = load_config([], {"MLM_MODEL_NAME_OR_PATH": "scratch:bert"})
    training = config.training
    assert (config.masking.mlm_probability, config.masking.eval_mlm_probability, config.data.padding) == (
        0.3,
        0.15,
        "packed",
    )
    assert training.lr_scheduler_type == "warmup_stable_decay"
    assert training.lr_scheduler_kwargs == {"decay_type": "1-sqrt"}
    assert (training.learning_rate, training.warmup_steps) == (1e-3, 0.06)
    assert (training.adam_beta2, training.adam_epsilon, training.weight_decay) == (0.98, 1e-6, 0.01)
    assert set(RECIPES["modern"]) <= set(config.sources)
    assert config.source_of("learning_rate") == "the modern recipe's learning_rate"


def test_a_pretrained_model_keeps_the_classic_defaults(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "bert"}', encoding="utf-8")
    (model / "model.safetensors").write_bytes(b"")
    for name in ("distilbert-base-uncased", str(model)):
        config = load_config([], {"MLM_MODEL_NAME_OR_PATH": name})
        assert (config.masking.mlm_probability, config.training.learning_rate) == (0.15, 5e-5)
        assert config.training.lr_scheduler_type == "linear"
        assert not set(RECIPES["modern"]) & set(config.sources)


def test_what_is_set_wins_over_the_recipe_and_the_recipe_can_be_chosen(tmp_path: Path) -> None:
    yaml = tmp_path / "c.yaml"
    yaml.write_text("model_name_or_path: scratch:roberta\nmlm_probability: 0.2\n", encoding="utf-8")
    config = load_config(["--config", str(yaml), "--learning_rate", "3e-4"], {"MLM_PADDING": "dynamic"})
    assert (config.masking.mlm_probability, config.training.learning_rate, config.data.padding) == (
        0.2,
        3e-4,
        "dynamic",
    )
    assert config.source_of("mlm_probability") == f"{yaml}: mlm_probability"
    assert config.training.adam_beta2 == 0.98  # what nothing set still comes from the recipe
    classic = load_config([], {"MLM_MODEL_NAME_OR_PATH": "scratch:bert", "MLM_RECIPE": "classic"})
    assert (classic.masking.mlm_probability, classic.training.lr_scheduler_type) == (0.15, "linear")
    modern = load_config([], {"MLM_MODEL_NAME_OR_PATH": "distilbert-base-uncased", "MLM_RECIPE": "modern"})
    assert modern.masking.mlm_probability == 0.3


def test_an_unknown_recipe_is_refused_naming_its_variable() -> None:
    with pytest.raises(ConfigError, match=r"^MLM_RECIPE='new'.*auto.*modern.*classic"):
        load_config([], {"MLM_RECIPE": "new"})


def test_warmup_stable_decay_decays_over_its_share_of_whatever_the_steps_are() -> None:
    wsd = "warmup_stable_decay"
    assert scheduler_kwargs(wsd, {"decay_type": "1-sqrt"}, 1000, 60, 0.2) == {
        "decay_type": "1-sqrt",
        "num_decay_steps": 200,
    }
    assert scheduler_kwargs(wsd, {}, 7, 1, 0.2) == {"num_decay_steps": 2}  # at least one, rounded up
    assert scheduler_kwargs(wsd, {}, 3, 3, 0.5) == {"num_decay_steps": 0}  # never more than the warm-up leaves
    assert scheduler_kwargs(wsd, {"num_decay_steps": 5}, 1000, 0, 0.2) == {"num_decay_steps": 5}  # given wins
    assert scheduler_kwargs("linear", {"x": 1}, 1000, 0, 0.2) == {"x": 1}
