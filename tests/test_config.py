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
        ([], {"MLM_MAX_SEQ_LENGTH": "0"}, None, r"MLM_MAX_SEQ_LENGTH=0: expected an integer from 8 to 1048576"),
        (
            [],
            {"MLM_PER_DEVICE_TRAIN_BATCH_SIZE": "0"},
            None,
            r"MLM_PER_DEVICE_TRAIN_BATCH_SIZE=0: expected a positive integer",
        ),
        (
            [],
            {"MLM_NPROC_PER_NODE": "many"},
            None,
            r"MLM_NPROC_PER_NODE='many': expected a positive integer up to 1024, auto, gpu or cpu",
        ),
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


INT64_OVER = str(2**63)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        # non-finite numbers, wherever they come from
        ([], {"MLM_LEARNING_RATE": "nan"}, r"MLM_LEARNING_RATE=nan: expected a finite number"),
        ([], {"MLM_LOGGING_STEPS": "inf"}, r"MLM_LOGGING_STEPS=inf: expected a finite number"),  # crashed __post_init__
        (["--max_grad_norm", "inf"], {}, r"--max_grad_norm=inf: expected a finite number"),
        ([], {"MLM_NUM_TRAIN_EPOCHS": "-inf"}, r"MLM_NUM_TRAIN_EPOCHS=-inf: expected a finite number"),
        (["--max_steps", "10", "--num_train_epochs", "nan"], {}, r"--num_train_epochs=nan: expected a finite"),
        ([], {"MLM_MLM_PROBABILITY": "nan"}, r"MLM_MLM_PROBABILITY=nan: expected a finite number"),
        ([], {"MLM_ADAM_EPSILON": "1e999"}, r"MLM_ADAM_EPSILON=inf: expected a finite number"),
        # rates and ratios
        ([], {"MLM_LEARNING_RATE": "0"}, r"MLM_LEARNING_RATE=0.0: expected a positive number"),
        ([], {"MLM_WEIGHT_DECAY": "-0.1"}, r"MLM_WEIGHT_DECAY=-0.1: expected a number >= 0"),
        # argparse took "-1e-05" for a flag ("expected one argument"): env values now go as --name=value
        ([], {"MLM_WEIGHT_DECAY": "-1e-5"}, r"MLM_WEIGHT_DECAY=-1e-05: expected a number >= 0"),
        ([], {"MLM_ADAM_BETA1": "1"}, r"MLM_ADAM_BETA1=1.0: expected a number in \[0, 1\)"),
        ([], {"MLM_ADAM_BETA2": "-0.5"}, r"MLM_ADAM_BETA2=-0.5: expected a number in \[0, 1\)"),
        ([], {"MLM_ADAM_EPSILON": "0"}, r"MLM_ADAM_EPSILON=0.0: expected a positive number"),
        ([], {"MLM_MAX_GRAD_NORM": "-1"}, r"MLM_MAX_GRAD_NORM=-1.0: expected a number >= 0 \(0 turns clipping off\)"),
        ([], {"MLM_LABEL_SMOOTHING_FACTOR": "1"}, r"MLM_LABEL_SMOOTHING_FACTOR=1.0: expected a number in \[0, 1\)"),
        # steps: a whole number, or a fraction of the run
        (
            [],
            {"MLM_WARMUP_STEPS": "-1"},
            r"MLM_WARMUP_STEPS=-1.0: expected a whole number of steps, or a fraction in \[0",
        ),
        ([], {"MLM_WARMUP_STEPS": "2.5"}, r"MLM_WARMUP_STEPS=2.5: expected a whole number of steps"),
        ([], {"MLM_SAVE_STEPS": "-3"}, r"MLM_SAVE_STEPS=-3.0: expected a whole number of steps, or a fraction in \(0"),
        ([], {"MLM_LOGGING_STEPS": "0"}, r"MLM_LOGGING_STEPS=0.0: expected a whole number of steps"),
        ([], {"MLM_EVAL_STEPS": "1e30"}, r"MLM_EVAL_STEPS=1e\+30: expected a whole number of steps"),
        (
            [],
            {"MLM_MAX_STEPS": "-7"},
            r"MLM_MAX_STEPS=-7: expected a positive integer, or -1 to train num_train_epochs",
        ),
        ([], {"MLM_MAX_STEPS": "0"}, r"MLM_MAX_STEPS=0: expected a positive integer, or -1"),
        # counts and seeds
        ([], {"MLM_SEED": "-1"}, r"MLM_SEED=-1: expected an integer from 0 to 2\*\*32 - 1"),
        ([], {"MLM_SEED": str(2**32)}, r"MLM_SEED=4294967296: expected an integer from 0 to 2\*\*32 - 1"),
        ([], {"MLM_DATA_SEED": str(2**32)}, r"MLM_DATA_SEED=4294967296: expected an integer from 0 to 2"),
        ([], {"MLM_SAVE_TOTAL_LIMIT": "-1"}, r"MLM_SAVE_TOTAL_LIMIT=-1: expected an integer >= 0 \(0 keeps every"),
        ([], {"MLM_EVAL_ACCUMULATION_STEPS": "0"}, r"MLM_EVAL_ACCUMULATION_STEPS=0: expected a positive integer"),
        ([], {"MLM_DATALOADER_NUM_WORKERS": "5000"}, r"MLM_DATALOADER_NUM_WORKERS=5000: expected an integer from 0"),
        (
            [],
            {"MLM_DDP_TIMEOUT": "99999999999999999"},
            r"MLM_DDP_TIMEOUT=99999999999999999: expected an integer from 1",
        ),
        ([], {"MLM_PREPROCESSING_NUM_WORKERS": "100000"}, r"MLM_PREPROCESSING_NUM_WORKERS=100000: expected an"),
        # sizes beyond 64 bits, or absurd
        (
            [],
            {"MLM_MAX_TRAIN_SAMPLES": INT64_OVER},
            rf"MLM_MAX_TRAIN_SAMPLES={INT64_OVER}: expected an integer from -2",
        ),
        (
            [],
            {"MLM_PER_DEVICE_TRAIN_BATCH_SIZE": INT64_OVER},
            r"MLM_PER_DEVICE_TRAIN_BATCH_SIZE=9223372036854775808: ex",
        ),
        ([], {"MLM_LOCAL_RANK": INT64_OVER}, r"MLM_LOCAL_RANK=9223372036854775808: expected an integer from -2\*\*63"),
        (
            [],
            {"MLM_DEMO_SAMPLES": str(10**12)},
            r"MLM_DEMO_SAMPLES=1000000000000: expected an integer from 1 to 10000000",
        ),
        (
            [],
            {"MLM_RDZV_TIMEOUT": str(10**9)},
            r"MLM_RDZV_TIMEOUT=1000000000: expected an integer from 1 to 604800 sec",
        ),
        ([], {"MLM_STOP_TIMEOUT": "0"}, r"MLM_STOP_TIMEOUT=0: expected an integer from 1 to 604800 seconds"),
        ([], {"MLM_MAX_RESTARTS": str(10**6)}, r"MLM_MAX_RESTARTS=1000000: expected an integer from 0 to 1000"),
        # what the tokenizer and the collator can honour
        ([], {"MLM_MAX_SEQ_LENGTH": "7"}, r"MLM_MAX_SEQ_LENGTH=7: expected an integer from 8 to 1048576"),
        ([], {"MLM_MAX_SEQ_LENGTH": str(2**21)}, r"MLM_MAX_SEQ_LENGTH=2097152: expected an integer from 8"),
        (
            ["--max_seq_length", "16"],
            {"MLM_PAD_TO_MULTIPLE_OF": "32"},
            r"MLM_PAD_TO_MULTIPLE_OF=32: expected at most max_seq_length \(16\)",
        ),
        # launcher options
        ([], {"MLM_NPROC_PER_NODE": "0"}, r"MLM_NPROC_PER_NODE='0': expected a positive integer up to 1024"),
        ([], {"MLM_NPROC_PER_NODE": "4096"}, r"MLM_NPROC_PER_NODE='4096': expected a positive integer up to 1024"),
        ([], {"MLM_NPROC_PER_NODE": "²"}, r"MLM_NPROC_PER_NODE='²': expected a positive integer"),
        ([], {"MLM_LOG_RANKS": "0,0"}, r"MLM_LOG_RANKS='0,0': expected distinct local ranks from 0 to 1023"),
        ([], {"MLM_LOG_RANKS": "-1"}, r"MLM_LOG_RANKS='-1': expected distinct local ranks"),
        ([], {"MLM_LOG_RANKS": "0,,1"}, r"MLM_LOG_RANKS='0,,1': expected distinct local ranks"),
        ([], {"MLM_LOG_RANKS": "1024"}, r"MLM_LOG_RANKS='1024': expected distinct local ranks from 0 to 1023"),
        # config_overrides syntax (unknown keys are train/model.py's, through update_from_string)
        ([], {"MLM_CONFIG_OVERRIDES": "n_layers2"}, r"MLM_CONFIG_OVERRIDES='n_layers2': expected comma-separated key="),
        ([], {"MLM_CONFIG_OVERRIDES": "n_layers=2,"}, r"MLM_CONFIG_OVERRIDES='n_layers=2,': expected comma-separated"),
        ([], {"MLM_CONFIG_OVERRIDES": "dim=1=2"}, r"MLM_CONFIG_OVERRIDES='dim=1=2': expected comma-separated"),
        ([], {"MLM_CONFIG_OVERRIDES": "n_layers=2, dim=8"}, r"MLM_CONFIG_OVERRIDES='n_layers=2, dim=8': expected"),
        (
            [],
            {"MLM_CONFIG_OVERRIDES": "dim=8,dim=16"},
            r"MLM_CONFIG_OVERRIDES='dim=8,dim=16': expected .* each key once",
        ),
    ],
)
def test_out_of_range_values_name_their_source(argv: list, env: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_config(argv, env)
    assert info.value.exit_code == EXIT_CONFIG
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        ([], {"MLM_NPROC_PER_NODE": "gpu"}),  # the README documents a number, auto, gpu, cpu
        ([], {"MLM_NPROC_PER_NODE": "CPU"}),
        ([], {"MLM_NPROC_PER_NODE": "1024"}),
        ([], {"MLM_LOG_RANKS": "0, 1"}),
        ([], {"MLM_LOG_RANKS": "all"}),
        ([], {"MLM_SEED": str(2**32 - 1), "MLM_DATA_SEED": "0"}),
        ([], {"MLM_WARMUP_STEPS": "0.1", "MLM_LOGGING_STEPS": "0.05", "MLM_SAVE_TOTAL_LIMIT": "0"}),
        ([], {"MLM_MAX_GRAD_NORM": "0", "MLM_ADAM_BETA1": "0"}),
        (["--max_steps", "10", "--num_train_epochs", "0"], {}),
        (["--max_seq_length", "8", "--pad_to_multiple_of", "8"], {}),
        ([], {"MLM_CONFIG_OVERRIDES": "n_layers=2,dim=128,activation=gelu,dropout=0.1"}),
    ],
)
def test_values_at_the_edges_are_accepted(argv: list, env: dict) -> None:
    load_config(argv, env)


def test_a_huge_value_is_echoed_short() -> None:
    huge = "9" * 1000
    for argv, env in (([], {"MLM_SEED": huge}), (["--seed", huge], {}), ([], {"MLM_LOG_RANKS": huge})):
        with pytest.raises(ConfigError) as info:
            load_config(argv, env)
        assert "…" in str(info.value) and "9" * 61 not in str(info.value)
        assert len(str(info.value)) < 200


def test_yaml_values_are_checked_like_env_values(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("learning_rate: .nan\n")
    with pytest.raises(ConfigError, match=r"job.yaml: learning_rate=nan: expected a finite number"):
        load_config([], {"MLM_CONFIG": str(path)})
    path.write_text("seed: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"job.yaml: seed='1 2': expected one value, an integer"):
        load_config([], {"MLM_CONFIG": str(path)})
    path.write_text("seed: " + "9" * 5000 + "\n")  # beyond what Python converts from a string
    with pytest.raises(ConfigError, match=r"job.yaml: not valid YAML \(Exceeds the limit"):
        load_config([], {"MLM_CONFIG": str(path)})


def test_duplicate_yaml_keys_are_errors(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("seed: 1\nlearning_rate: 0.001\nseed: 2\n")
    with pytest.raises(ConfigError, match=r"job.yaml: 'seed' is set twice \(lines 1 and 3\); expected each key once"):
        load_config([], {"MLM_CONFIG": str(path)})
    path.write_text("lr_scheduler_kwargs:\n  power: 1\n  power: 2\n")
    with pytest.raises(ConfigError, match=r"'power' is set twice \(lines 2 and 3\)"):
        load_config([], {"MLM_CONFIG": str(path)})
    # keys merged in with << may be overridden: that is what merging is for
    path.write_text("base: &base {seed: 1}\n")
    assert yaml.safe_load(path.read_text()) == {"base": {"seed": 1}}
    merged = tmp_path / "merged.yaml"
    merged.write_text("? !!merge\n: {seed: 1}\nseed: 2\n")
    assert load_config([], {"MLM_CONFIG": str(merged)}).training.seed == 2


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


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, "non_padding"), ("non_padding", "non_padding"), ("ALL", "all"), ("no", "no"), ("true", "all"),
     ("false", "no"), ("0", "no")],
)  # fmt: skip
def test_real_tokens_are_counted_by_default_and_every_trainer_value_parses(given, expected, tmp_path: Path) -> None:
    """HfArgumentParser reads ``str | bool`` as a bool and rejected non_padding; ours takes what the Trainer takes."""
    env = {} if given is None else {"MLM_INCLUDE_NUM_INPUT_TOKENS_SEEN": given}
    assert load_config([], env).training.include_num_input_tokens_seen == expected
    config_file = tmp_path / "c.yaml"
    config_file.write_text(f"include_num_input_tokens_seen: {given or 'non_padding'}\n")
    assert load_config(["--config", str(config_file)], {}).training.include_num_input_tokens_seen == expected


def test_a_token_count_mode_that_does_not_exist_names_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"MLM_INCLUDE_NUM_INPUT_TOKENS_SEEN='padding': expected one of all, non"):
        load_config([], {"MLM_INCLUDE_NUM_INPUT_TOKENS_SEEN": "padding"})
