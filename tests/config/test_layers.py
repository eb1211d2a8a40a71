"""The layers: precedence defaults < YAML < env < CLI, unknown keys, values that name their source, redaction."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config.helpers import REPO, write_yaml
from train.common.errors import EXIT_CONFIG, ConfigError
from train.config import load_config, move_hub_token_to_env


def test_precedence_default_yaml_env_cli(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path, {"num_train_epochs": 3, "per_device_train_batch_size": 8, "seed": 7, "padding": "packed"}
    )
    env = {"MLM_CONFIG": path, "MLM_PER_DEVICE_TRAIN_BATCH_SIZE": "16", "MLM_SEED": "9"}
    config = load_config(["--seed", "11"], env)
    assert config.training.num_train_epochs == 3  # YAML beats the default
    assert config.training.per_device_train_batch_size == 16  # env beats YAML
    assert config.training.seed == 11  # CLI beats env
    assert config.data.padding == "packed"
    assert config.data.max_seq_length == 128  # untouched default
    assert config.sources["seed"] == "--seed"
    assert config.sources["per_device_train_batch_size"] == "MLM_PER_DEVICE_TRAIN_BATCH_SIZE"
    assert config.sources["num_train_epochs"] == f"{path}: num_train_epochs"


def test_config_flag_beats_mlm_config(tmp_path: Path) -> None:
    env_yaml = write_yaml(tmp_path, {"seed": 1})
    other = tmp_path / "other.yaml"
    other.write_text("seed: 2\n")
    assert load_config(["--config", str(other)], {"MLM_CONFIG": env_yaml}).training.seed == 2
    assert load_config([f"--config={other}"], {}).training.seed == 2
    with pytest.raises(ConfigError, match=r"--config: expected a path to a YAML file"):
        load_config(["--config"], {})


def test_list_and_bool_values_from_env_and_yaml(tmp_path: Path) -> None:
    config = load_config([], {"MLM_REPORT_TO": "tensorboard", "MLM_MASKED_ONLY_HEAD": "true"})
    assert config.training.report_to == ["tensorboard"]
    assert config.model.masked_only_head is True
    path = write_yaml(tmp_path, {"masked_only_head": True, "report_to": ["none"]})
    assert load_config([], {"MLM_CONFIG": path}).model.masked_only_head is True


def test_a_comma_list_names_several_trackers_and_the_cli_replaces_it() -> None:
    env = {"MLM_REPORT_TO": "mlflow,tensorboard"}
    assert load_config([], env).training.report_to == ["mlflow", "tensorboard"]
    config = load_config(["--report_to", "none"], env)
    assert config.training.report_to == [] and config.sources["report_to"] == "--report_to"


def test_a_yaml_key_without_a_value_leaves_the_option_but_must_be_one(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("seed:\n")
    config = load_config([], {"MLM_CONFIG": str(path)})
    assert config.training.seed == 42 and "seed" not in config.sources
    path.write_text("sede:\n")
    with pytest.raises(ConfigError, match=r"job.yaml: unknown option 'sede'; did you mean seed\?"):
        load_config([], {"MLM_CONFIG": str(path)})


def test_a_cli_negation_sets_its_option_and_names_its_source() -> None:
    config = load_config(["--no_masked_only_head"], {"MLM_MASKED_ONLY_HEAD": "true"})
    assert config.model.masked_only_head is False
    assert config.sources["masked_only_head"] == "--no_masked_only_head"


def test_a_value_starting_with_a_dash_is_no_flag(tmp_path: Path) -> None:
    """Env and YAML values go to argparse as --name=value: "-1" would otherwise read as a flag."""
    assert load_config([], {"MLM_MAX_STEPS": "-1"}).training.max_steps == -1
    assert load_config([], {"MLM_CONFIG": write_yaml(tmp_path, {"max_steps": -1})}).training.max_steps == -1


def test_layers_report_errors_in_their_order(tmp_path: Path) -> None:
    """YAML is read before the environment, the environment before the command line."""
    path = write_yaml(tmp_path, {"seed": "x"})
    with pytest.raises(ConfigError, match=r"job.yaml: seed='x'"):
        load_config(["--seed", "y"], {"MLM_CONFIG": path, "MLM_SEED": "z"})
    with pytest.raises(ConfigError, match=r"MLM_SEED='z'"):
        load_config(["--seed", "y"], {"MLM_SEED": "z"})


@pytest.mark.parametrize(
    ("argv", "env", "yaml_data", "message"),
    [
        (
            [],
            {"MLM_PER_DEVICE_TRAIN_BATCH_SZE": "8"},
            None,
            r"MLM_PER_DEVICE_TRAIN_BATCH_SZE: unknown option; did you mean MLM_PER_DEVICE_TRAIN_BATCH_SIZE\?",
        ),
        ([], {}, {"max_seq_lenght": 64}, r"unknown option 'max_seq_lenght'; did you mean max_seq_length\?"),
        (["--mlm_probabilty", "0.2"], {}, None, r"--mlm_probabilty: unknown option; did you mean mlm_probability\?"),
        (["--no_maskd_only_head"], {}, None, r"--no_maskd_only_head: unknown option; did you mean masked_only_head"),
        ([], {"MLM_QQQQQQQQQQQQQQQQ": "1"}, None, r"^MLM_QQQQQQQQQQQQQQQQ: unknown option$"),
        (
            [],
            {"MLM_PER_DEVICE_TRAIN_BATCH_SIZE": "abc"},
            None,
            r"MLM_PER_DEVICE_TRAIN_BATCH_SIZE='abc': expected an integer",
        ),
        ([], {"MLM_MLM_PROBABILITY": "lots"}, None, r"MLM_MLM_PROBABILITY='lots': expected a number"),
        ([], {"MLM_FP16": "maybe"}, None, r"MLM_FP16='maybe': expected true or false"),
        ([], {"MLM_PADDING": "longest"}, None, r"MLM_PADDING='longest': expected one of dynamic, max_length, packed"),
        (
            [],
            {},
            {"per_device_train_batch_size": "big"},
            r"job.yaml: per_device_train_batch_size='big': expected an integer",
        ),
        (["--max_seq_length", "x"], {}, None, r"--max_seq_length='x': expected an integer"),
        (["--seed=1.5"], {}, None, r"--seed='1.5': expected an integer"),
    ],
)
def test_bad_values_name_their_source(
    tmp_path: Path, argv: list, env: dict, yaml_data: dict | None, message: str
) -> None:
    if yaml_data is not None:
        env = {**env, "MLM_CONFIG": write_yaml(tmp_path, yaml_data)}
    with pytest.raises(ConfigError, match=message) as info:
        load_config(argv, env)
    assert info.value.exit_code == EXIT_CONFIG
    assert "\n" not in str(info.value)


def test_yaml_values_are_checked_like_env_values(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("learning_rate: .nan\n")
    with pytest.raises(ConfigError, match=r"job.yaml: learning_rate=nan: expected a finite number"):
        load_config([], {"MLM_CONFIG": str(path)})
    path.write_text("seed: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"job.yaml: seed='1 2': expected one value, an integer"):
        load_config([], {"MLM_CONFIG": str(path)})


def test_a_combination_the_trainer_refuses_is_one_line_exit_2() -> None:
    """TrainingArguments.__post_init__'s own errors become ConfigError, on one line."""
    with pytest.raises(ConfigError) as info:
        load_config(["--load_best_model_at_end", "true", "--eval_strategy", "steps", "--save_strategy", "epoch"], {})
    assert info.value.exit_code == EXIT_CONFIG and "\n" not in str(info.value)


def test_secrets_are_redacted() -> None:
    config = load_config(["--hub_token", "hf_canary_123"], {})
    assert config.training.hub_token == "hf_canary_123"
    assert "hf_canary_123" not in str(config.as_dict())
    assert config.as_dict()["hub_token"] == "***"


def test_the_hub_token_moves_from_the_config_into_the_environment() -> None:
    """The Trainer pickles its arguments into training_args.bin: the token must not be among them."""
    config = load_config(["--hub_token", "hf_canary_123"], {})
    environ: dict[str, str] = {}
    move_hub_token_to_env(config, environ)
    assert config.training.hub_token is None and environ == {"HF_TOKEN": "hf_canary_123"}
    config = load_config(["--hub_token", "hf_option"], {})
    environ = {"HF_TOKEN": "hf_given"}
    move_hub_token_to_env(config, environ)  # a token already in the environment wins, as for huggingface_hub
    assert config.training.hub_token is None and environ == {"HF_TOKEN": "hf_given"}


def test_seed_preset_is_the_seed_recipe() -> None:
    config = load_config(["--config", str(REPO / "configs" / "seed.yaml")], {})
    training = config.training
    assert (config.model.model_name_or_path, config.data.dataset, config.data.demo_samples) == (
        "distilbert-base-uncased",
        "demo",
        50000,
    )
    assert (config.data.padding, config.data.max_seq_length, config.masking.mlm_probability) == (
        "max_length",
        128,
        0.15,
    )
    assert config.data.validation_split_percentage == 20  # 40,000 / 10,000 like the seed
    assert training.num_train_epochs == 2
    assert (training.per_device_train_batch_size, training.per_device_eval_batch_size) == (32, 32)
    assert (training.eval_strategy.value, training.save_strategy.value, training.logging_steps) == (
        "epoch",
        "epoch",
        50,
    )
    assert training.fp16 is True and training.dataloader_num_workers == 4
    assert training.report_to == []


def test_demo_preset_needs_no_hub() -> None:
    config = load_config(["--config", str(REPO / "configs" / "demo.yaml")], {})
    assert config.model.model_name_or_path.startswith("scratch:")
    assert config.model.tokenizer_name is None and config.data.dataset == "demo"
