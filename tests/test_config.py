"""The schema: precedence defaults < YAML < env < CLI, unknown keys, types and ranges, redaction, the README table."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tools.options import main as options_main
from train.config import load_config
from train.errors import EXIT_CONFIG, ConfigError

REPO = Path(__file__).resolve().parent.parent


def write_yaml(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_defaults_are_ours() -> None:
    config = load_config([], {})
    assert config.job.model_name_or_path == "distilbert-base-uncased"
    assert config.job.padding == "dynamic"
    assert config.job.max_seq_length == 128
    assert config.job.mlm_probability == 0.15
    assert config.job.demo_samples == 50000
    assert config.training.output_dir == "./output"
    assert config.training.per_device_train_batch_size == 32
    assert config.sources == {}


def test_precedence_default_yaml_env_cli(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path, {"num_train_epochs": 3, "per_device_train_batch_size": 8, "seed": 7, "padding": "packed"}
    )
    env = {"MLM_CONFIG": path, "MLM_PER_DEVICE_TRAIN_BATCH_SIZE": "16", "MLM_SEED": "9"}
    config = load_config(["--seed", "11"], env)
    assert config.training.num_train_epochs == 3  # YAML beats the default
    assert config.training.per_device_train_batch_size == 16  # env beats YAML
    assert config.training.seed == 11  # CLI beats env
    assert config.job.padding == "packed"
    assert config.job.max_seq_length == 128  # untouched default
    assert config.sources["seed"] == "--seed"
    assert config.sources["per_device_train_batch_size"] == "MLM_PER_DEVICE_TRAIN_BATCH_SIZE"
    assert config.sources["num_train_epochs"] == f"{path}: num_train_epochs"


def test_config_flag_beats_mlm_config(tmp_path: Path) -> None:
    env_yaml = write_yaml(tmp_path, {"seed": 1})
    other = tmp_path / "other.yaml"
    other.write_text("seed: 2\n")
    assert load_config(["--config", str(other)], {"MLM_CONFIG": env_yaml}).training.seed == 2
    assert load_config([f"--config={other}"], {}).training.seed == 2


def test_list_and_bool_values_from_env_and_yaml(tmp_path: Path) -> None:
    config = load_config([], {"MLM_REPORT_TO": "tensorboard", "MLM_MASKED_ONLY_HEAD": "true"})
    assert config.training.report_to == ["tensorboard"]
    assert config.job.masked_only_head is True
    path = write_yaml(tmp_path, {"masked_only_head": True, "report_to": ["none"]})
    assert load_config([], {"MLM_CONFIG": path}).job.masked_only_head is True


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
        (
            [],
            {"MLM_PER_DEVICE_TRAIN_BATCH_SIZE": "abc"},
            None,
            r"MLM_PER_DEVICE_TRAIN_BATCH_SIZE='abc': expected an integer",
        ),
        ([], {"MLM_MLM_PROBABILITY": "lots"}, None, r"MLM_MLM_PROBABILITY='lots': expected a number"),
        ([], {"MLM_FP16": "maybe"}, None, r"MLM_FP16='maybe': expected true or false"),
        ([], {"MLM_PADDING": "longest"}, None, r"MLM_PADDING='longest': expected one of dynamic, max_length, packed"),
        ([], {"MLM_NUM_TRAIN_EPOCHS": "-1"}, None, r"MLM_NUM_TRAIN_EPOCHS=-1.0: expected a positive number"),
        ([], {"MLM_MLM_PROBABILITY": "1.5"}, None, r"MLM_MLM_PROBABILITY=1.5: expected a number between 0 and 1"),
        ([], {"MLM_MLM_PROBABILITY": "0"}, None, r"MLM_MLM_PROBABILITY=0.0: expected a number between 0 and 1"),
        ([], {"MLM_MAX_SEQ_LENGTH": "0"}, None, r"MLM_MAX_SEQ_LENGTH=0: expected a positive integer"),
        (
            [],
            {"MLM_PER_DEVICE_TRAIN_BATCH_SIZE": "0"},
            None,
            r"MLM_PER_DEVICE_TRAIN_BATCH_SIZE=0: expected a positive integer",
        ),
        ([], {"MLM_NPROC_PER_NODE": "many"}, None, r"MLM_NPROC_PER_NODE='many': expected a positive integer or auto"),
        (
            [],
            {},
            {"per_device_train_batch_size": "big"},
            r"job.yaml: per_device_train_batch_size='big': expected an integer",
        ),
        (["--max_seq_length", "x"], {}, None, r"--max_seq_length.*invalid int value: 'x'"),
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


def test_yaml_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no such file '.*missing.yaml'"):
        load_config([], {"MLM_CONFIG": str(tmp_path / "missing.yaml")})
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: not valid YAML"):
        load_config([], {"MLM_CONFIG": str(bad)})
    listing = tmp_path / "list.yaml"
    listing.write_text("- seed\n")
    with pytest.raises(ConfigError, match=r"list.yaml: expected a mapping of option: value, got list"):
        load_config([], {"MLM_CONFIG": str(listing)})


def test_secrets_are_redacted() -> None:
    config = load_config(["--hub_token", "hf_canary_123"], {})
    assert config.training.hub_token == "hf_canary_123"
    assert "hf_canary_123" not in str(config.as_dict())
    assert config.as_dict()["hub_token"] == "***"


def test_seed_preset_is_the_seed_recipe() -> None:
    config = load_config(["--config", str(REPO / "configs" / "seed.yaml")], {})
    job, training = config.job, config.training
    assert (job.model_name_or_path, job.dataset, job.demo_samples) == ("distilbert-base-uncased", "demo", 50000)
    assert (job.padding, job.max_seq_length, job.mlm_probability) == ("max_length", 128, 0.15)
    assert job.validation_split_percentage == 20  # 40,000 / 10,000 like the seed
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
    assert config.job.model_name_or_path.startswith("scratch:")
    assert config.job.tokenizer_name is None and config.job.dataset == "demo"


def test_readme_option_table_is_current() -> None:
    assert options_main(["--check", str(REPO / "README.md")]) == 0


def test_stale_table_is_detected(tmp_path: Path) -> None:
    stale = tmp_path / "README.md"
    text = (REPO / "README.md").read_text().replace("`MLM_DEMO_SAMPLES`", "`MLM_DEMO_SAMPLEZ`")
    stale.write_text(text)
    assert options_main(["--check", str(stale)]) == 1
