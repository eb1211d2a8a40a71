"""Validation: every bound of the schema and the rules between options, each error naming its source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.config.helpers import value_of, write_yaml
from train.common.errors import EXIT_CONFIG, ConfigError
from train.common.mixture import mixture_parts
from train.config import load_config

INT64_OVER = str(2**63)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {"MLM_NUM_TRAIN_EPOCHS": "-1"}, r"MLM_NUM_TRAIN_EPOCHS=-1.0: expected a positive number"),
        ([], {"MLM_MLM_PROBABILITY": "1.5"}, r"MLM_MLM_PROBABILITY=1.5: expected a number between 0 and 1"),
        ([], {"MLM_MLM_PROBABILITY": "0"}, r"MLM_MLM_PROBABILITY=0.0: expected a number between 0 and 1"),
        ([], {"MLM_MAX_SEQ_LENGTH": "0"}, r"MLM_MAX_SEQ_LENGTH=0: expected an integer from 8 to 1048576"),
        (
            [],
            {"MLM_PER_DEVICE_TRAIN_BATCH_SIZE": "0"},
            r"MLM_PER_DEVICE_TRAIN_BATCH_SIZE=0: expected a positive integer",
        ),
        (
            [],
            {"MLM_NPROC_PER_NODE": "many"},
            r"MLM_NPROC_PER_NODE='many': expected a positive integer up to 1024, auto, gpu or cpu",
        ),
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
        ([], {"MLM_NPROC_PER_NODE": ""}, r"MLM_NPROC_PER_NODE='': expected a positive integer"),
        ([], {"MLM_LOG_RANKS": "0,0"}, r"MLM_LOG_RANKS='0,0': expected distinct local ranks from 0 to 1023"),
        ([], {"MLM_LOG_RANKS": "-1"}, r"MLM_LOG_RANKS='-1': expected distinct local ranks"),
        ([], {"MLM_LOG_RANKS": "0,,1"}, r"MLM_LOG_RANKS='0,,1': expected distinct local ranks"),
        ([], {"MLM_LOG_RANKS": "1024"}, r"MLM_LOG_RANKS='1024': expected distinct local ranks from 0 to 1023"),
        # config_overrides syntax (unknown keys are train/model/load.py's, through update_from_string)
        ([], {"MLM_CONFIG_OVERRIDES": "n_layers2"}, r"MLM_CONFIG_OVERRIDES='n_layers2': expected comma-separated key="),
        ([], {"MLM_CONFIG_OVERRIDES": "n_layers=2,"}, r"MLM_CONFIG_OVERRIDES='n_layers=2,': expected comma-separated"),
        ([], {"MLM_CONFIG_OVERRIDES": "dim=1=2"}, r"MLM_CONFIG_OVERRIDES='dim=1=2': expected comma-separated"),
        ([], {"MLM_CONFIG_OVERRIDES": "n_layers=2, dim=8"}, r"MLM_CONFIG_OVERRIDES='n_layers=2, dim=8': expected"),
        (
            [],
            {"MLM_CONFIG_OVERRIDES": "dim=8,dim=16"},
            r"MLM_CONFIG_OVERRIDES='dim=8,dim=16': expected .* each key once",
        ),
        # names that must say something
        ([], {"MLM_DATASET": " "}, r"MLM_DATASET=' ': expected demo, a local path or a hub dataset id"),
        ([], {"MLM_RESUME": ""}, r"MLM_RESUME='': expected auto, never or a checkpoint path"),
        (["--model_name_or_path="], {}, r"--model_name_or_path='': expected a hub id, a local directory or scratch"),
        # between options
        ([], {"MLM_NUM_TRAIN_EPOCHS": "0"}, r"MLM_NUM_TRAIN_EPOCHS=0.0: expected a positive number \(or 0 with max_st"),
        ([], {"MLM_STREAMING": "true"}, r"MLM_STREAMING='true': expected with max_steps, as a stream has no length"),
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
        ([], {"MLM_NUM_TRAIN_EPOCHS": "-3", "MLM_MAX_STEPS": "10"}),  # was accepted: max_steps made it unused
        (["--num_train_epochs=-0.5", "--max_steps", "10"], {}),
        (["--num_train_epochs", "-1"], {"MLM_MAX_STEPS": "5"}),
    ],
)
def test_a_negative_epoch_count_is_an_error_whatever_else_is_set(argv: list, env: dict) -> None:
    with pytest.raises(ConfigError, match=r"(MLM|--)_?[nN][uU][mM]_[tT]RAIN_EPOCHS|num_train_epochs") as info:
        load_config(argv, env)
    assert info.value.exit_code == EXIT_CONFIG
    assert "expected a positive number (or 0 with max_steps)" in str(info.value)


def test_a_negative_epoch_count_in_yaml_names_the_file(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, {"num_train_epochs": -3, "max_steps": 10})
    with pytest.raises(ConfigError, match=r"job.yaml: num_train_epochs=-3.0: expected a positive number"):
        load_config([], {"MLM_CONFIG": path})


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], {"MLM_NPROC_PER_NODE": "gpu"}, {"nproc_per_node": "gpu"}),  # the README documents a number, auto, gpu, cpu
        ([], {"MLM_NPROC_PER_NODE": "CPU"}, {"nproc_per_node": "CPU"}),  # as given: the launcher reads it case-blind
        ([], {"MLM_NPROC_PER_NODE": "1024"}, {"nproc_per_node": "1024"}),
        ([], {"MLM_LOG_RANKS": "0, 1"}, {"log_ranks": "0, 1"}),
        ([], {"MLM_LOG_RANKS": "all"}, {"log_ranks": "all"}),
        ([], {"MLM_SEED": str(2**32 - 1), "MLM_DATA_SEED": "0"}, {"seed": 2**32 - 1, "data_seed": 0}),
        (
            [],
            {"MLM_WARMUP_STEPS": "0.1", "MLM_LOGGING_STEPS": "0.05", "MLM_SAVE_TOTAL_LIMIT": "0"},
            {"warmup_steps": 0.1, "logging_steps": 0.05, "save_total_limit": 0},
        ),
        ([], {"MLM_MAX_GRAD_NORM": "0", "MLM_ADAM_BETA1": "0"}, {"max_grad_norm": 0.0, "adam_beta1": 0.0}),
        (["--max_steps", "10", "--num_train_epochs", "0"], {}, {"max_steps": 10, "num_train_epochs": 0.0}),
        (["--max_seq_length", "8", "--pad_to_multiple_of", "8"], {}, {"max_seq_length": 8, "pad_to_multiple_of": 8}),
        (
            [],
            {"MLM_CONFIG_OVERRIDES": "n_layers=2,dim=128,activation=gelu,dropout=0.1"},
            {"config_overrides": "n_layers=2,dim=128,activation=gelu,dropout=0.1"},
        ),
        ([], {"MLM_CONFIG_OVERRIDES": ""}, {"config_overrides": ""}),  # compose's ${VAR:-}: no overrides
        ([], {"MLM_STREAMING": "true", "MLM_MAX_STEPS": "1"}, {"streaming": True, "max_steps": 1}),
        (
            [],
            {"MLM_MAX_RESTARTS": "1000", "MLM_STOP_TIMEOUT": "604800"},
            {"max_restarts": 1000, "stop_timeout": 604800},
        ),
    ],
)
def test_values_at_the_edges_are_accepted(argv: list, env: dict, expected: dict[str, Any]) -> None:
    config = load_config(argv, env)
    assert {name: value_of(config, name) for name in expected} == expected


def test_a_huge_value_is_echoed_short() -> None:
    huge = "9" * 1000
    for argv, env in (([], {"MLM_SEED": huge}), (["--seed", huge], {}), ([], {"MLM_LOG_RANKS": huge})):
        with pytest.raises(ConfigError) as info:
            load_config(argv, env)
        assert "…" in str(info.value) and "9" * 61 not in str(info.value)
        assert len(str(info.value)) < 200


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MLM_STREAMING": "true", "MLM_MAX_STEPS": "5"}, "MLM_STREAMING='true': expected false with a mixture"),
        ({"MLM_VALIDATION_FILE": "held.txt"}, "MLM_VALIDATION_FILE='held.txt': expected unset with a mixture"),
        ({"MLM_DATASET_CONFIG_NAME": "en"}, "MLM_DATASET_CONFIG_NAME='en': expected unset with a mixture"),
        ({"MLM_DATASET": "a.txt=1,b.txt=-1"}, "MLM_DATASET: the weight of 'b.txt' is '-1'"),
    ],
)
def test_a_mixture_refuses_what_it_cannot_do_naming_the_option(env: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config([], {"MLM_DATASET": "a.txt=0.7,b.txt=0.3", **env})
    assert str(info.value).startswith(message) and info.value.exit_code == EXIT_CONFIG


def test_a_mixture_in_yaml_is_a_mapping_of_source_and_weight(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, {"dataset": {"news.txt": 1, "legal.txt": 3}})
    config = load_config([], {"MLM_CONFIG": path})
    parts = mixture_parts(config.data.dataset, config.source_of("dataset")) or ()
    assert {(part.name, part.weight) for part in parts} == {("news.txt", 0.25), ("legal.txt", 0.75)}
