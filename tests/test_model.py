"""Model configs: what the model would reject at its first save is refused before any data is read; the attention
implementation chosen per model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from train.common.errors import ConfigError

VOCAB = 97


def test_overrides_are_constructor_arguments_so_derived_fields_follow() -> None:
    from train.config import load_config
    from train.model.load import scratch_config

    # update_from_string on a built ModernBERT config left its 22 layer_types beside num_hidden_layers=2, and the
    # first checkpoint save refused it after all the training.
    env = {"MLM_MODEL_NAME_OR_PATH": "scratch:modernbert", "MLM_CONFIG_OVERRIDES": "num_hidden_layers=2,hidden_size=64"}
    arch = scratch_config(load_config([], env).model)
    assert (arch.num_hidden_layers, len(arch.layer_types), arch.hidden_size) == (2, 2, 64)
    arch.validate()  # what save_pretrained runs
    with pytest.raises(ConfigError, match=r"MLM_CONFIG_OVERRIDES: 'no_such_field' is not a field of the modernbert"):
        scratch_config(load_config([], {**env, "MLM_CONFIG_OVERRIDES": "no_such_field=3"}).model)


def test_an_unknown_override_key_names_the_nearest_field_in_either_form(tmp_path: Path) -> None:
    from train.config import load_config
    from train.model.load import scratch_config

    # issue 51: distilbert's layers are n_layers; num_layers was refused without a hint (pairs) or, as a YAML
    # mapping, kept as an attribute no model reads: the default six layers trained.
    env = {"MLM_MODEL_NAME_OR_PATH": "scratch:distilbert", "MLM_CONFIG_OVERRIDES": "dim=64,num_layers=2"}
    hint = r"MLM_CONFIG_OVERRIDES: 'num_layers' is not a field of the distilbert config; did you mean 'n_layers'\?$"
    with pytest.raises(ConfigError, match=hint):
        scratch_config(load_config([], env).model)
    (tmp_path / "job.yaml").write_text("model_name_or_path: scratch:distilbert\nconfig_overrides:\n  num_layers: 2\n")
    with pytest.raises(ConfigError, match=r"'num_layers' is not a field of the distilbert config; did you mean 'n_l"):
        scratch_config(load_config([], {"MLM_CONFIG": str(tmp_path / "job.yaml")}).model)
    with pytest.raises(ConfigError, match=r"'zzz' is not .* config; expected one of vocab_size, .*n_layers, n_heads"):
        scratch_config(load_config([], {**env, "MLM_CONFIG_OVERRIDES": "zzz=1"}).model)
    # a name the config maps to its own field is one (distilbert's num_hidden_layers is n_layers)
    assert scratch_config(load_config([], {**env, "MLM_CONFIG_OVERRIDES": "num_hidden_layers=2"}).model).n_layers == 2
    # in a mapping, a key far from every field may be one the model's code reads with no default in its config
    deberta = {"MLM_MODEL_NAME_OR_PATH": "scratch:deberta-v2", "MLM_CONFIG_OVERRIDES": '{"conv_kernel_size": 3}'}
    assert scratch_config(load_config([], deberta).model).conv_kernel_size == 3


def test_a_config_the_model_would_reject_at_its_first_save_is_refused_before_any_data(tmp_path: Path) -> None:
    from train.config import load_config
    from train.model.load import scratch_config

    inconsistent = {"model_type": "modernbert", "num_hidden_layers": 2, "layer_types": ["full_attention"] * 3}
    (tmp_path / "config.json").write_text(json.dumps(inconsistent))
    config = load_config([], {"MLM_MODEL_NAME_OR_PATH": str(tmp_path / "config.json")})
    with pytest.raises(ConfigError, match=r"MLM_MODEL_NAME_OR_PATH: the model rejects this config \(.*layer_types"):
        scratch_config(config.model)
    with pytest.raises(ConfigError, match=r"unknown model type 'nosuch'; expected e.g. scratch:distilbert"):
        scratch_config(load_config([], {"MLM_MODEL_NAME_OR_PATH": "scratch:nosuch"}).model)


@pytest.mark.parametrize(("model_type", "expected"), [("bert", "sdpa"), ("deberta-v2", "eager"), ("mpnet", "eager")])
def test_attention_is_the_models_best_and_the_option_overrides_it(model_type: str, expected: str) -> None:
    from transformers import AutoConfig, AutoModelForMaskedLM

    from train.config import load_config
    from train.model.load import attention_implementation

    small = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    arch = AutoConfig.for_model(model_type, vocab_size=50, **small)
    chosen = attention_implementation(load_config([], {}).model, arch)  # auto, no GPU here: transformers' choice
    assert chosen is None
    model = AutoModelForMaskedLM.from_config(arch, attn_implementation=chosen)  # SDPA asked of DeBERTa fails
    assert model.config._attn_implementation == expected
    eager = load_config([], {"MLM_ATTN_IMPLEMENTATION": "eager"})
    assert attention_implementation(eager.model, arch) == "eager"


def test_overrides_as_a_yaml_mapping_take_lists(tmp_path: Path) -> None:
    from train.config import load_config
    from train.model.load import scratch_config

    # ModernBERT's layer_types is a list: key=value pairs cannot say it, a YAML mapping can.
    (tmp_path / "job.yaml").write_text(
        "model_name_or_path: scratch:modernbert\n"
        "config_overrides:\n  num_hidden_layers: 3\n  hidden_size: 64\n"
        "  layer_types: [full_attention, sliding_attention, full_attention]\n"
    )
    arch = scratch_config(load_config([], {"MLM_CONFIG": str(tmp_path / "job.yaml")}).model)
    assert (arch.num_hidden_layers, arch.hidden_size) == (3, 64)
    assert arch.layer_types == ["full_attention", "sliding_attention", "full_attention"]
    with pytest.raises(ConfigError, match=r"MLM_CONFIG_OVERRIDES=.*expected comma-separated key=value pairs.*JSON"):
        load_config([], {"MLM_MODEL_NAME_OR_PATH": "scratch:bert", "MLM_CONFIG_OVERRIDES": "{not json"})


def test_a_type_without_a_masked_lm_class_is_refused_before_any_data(tmp_path: Path) -> None:
    from train.config import load_config
    from train.model.load import check_before_data, scratch_config

    with pytest.raises(ConfigError, match=r"MLM_MODEL_NAME_OR_PATH='scratch:gpt2': 'gpt2' has no masked-LM class"):
        scratch_config(load_config([], {"MLM_MODEL_NAME_OR_PATH": "scratch:gpt2"}).model)
    # A pretrained directory's config.json says the same before its weights or any data are read.
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    config = load_config([], {"MLM_MODEL_NAME_OR_PATH": str(tmp_path)})
    assert scratch_config(config.model) is None
    with pytest.raises(ConfigError, match=r"'gpt2' has no masked-LM class in transformers"):
        check_before_data(config.model, config.data, None)
