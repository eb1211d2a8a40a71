"""The YAML layer's file: a mapping of option: value, each key once, errors naming the file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from train.common.errors import ConfigError
from train.config import load_config, read_yaml


def test_an_empty_file_sets_nothing(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing yet\n")
    assert read_yaml(str(path)) == {}


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


def test_a_missing_file_named_like_a_preset_suggests_the_preset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = Path(__file__).resolve().parents[2]
    assert (repo / "configs" / "bert-base.yaml").is_file()
    monkeypatch.chdir(repo)  # as the README's commands run: the preset's path as typed there
    with pytest.raises(ConfigError, match=r"no such file 'bert-base'; did you mean 'configs/bert-base.yaml'\?$"):
        load_config(["--config", "bert-base"], {})
    with pytest.raises(ConfigError, match=r"no such file 'roberta_base.yml'; did you mean 'configs/roberta-base.yaml'"):
        load_config([], {"MLM_CONFIG": "roberta_base.yml"})
    monkeypatch.chdir(tmp_path)  # elsewhere: the preset's whole path
    with pytest.raises(ConfigError, match=re.escape(f"did you mean '{repo}/configs/bert-base.yaml'?")):
        load_config([], {"MLM_CONFIG": "bert-base"})
    with pytest.raises(ConfigError, match=r"no such file 'zzzz'; expected a YAML file of options, such as a preset in"):
        load_config([], {"MLM_CONFIG": "zzzz"})


def test_an_integer_beyond_what_python_converts_is_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("seed: " + "9" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"job.yaml: not valid YAML \(Exceeds the limit") as info:
        load_config([], {"MLM_CONFIG": str(path)})
    assert "\n" not in str(info.value) and len(str(info.value)) < 300
