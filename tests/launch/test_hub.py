"""The launcher's one question to the hub (train/launch/hub.py): which repositories a run reads from it, and what
each answer does to the launch. The request itself is replaced here; a real one to a closed port:
tests/e2e/test_bad_input.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from huggingface_hub.errors import RepositoryNotFoundError

from train.common import hub_reach
from train.common.errors import ConfigError, EnvironmentProblem
from train.config import load_config
from train.launch.hub import hub_repositories, reach_the_hub


def config_of(*args: str):
    return load_config(list(args), environ={})


def online(tmp_path: Path) -> dict[str, str]:
    return {"HF_HOME": str(tmp_path / "hf")}


def cache(tmp_path: Path, repo_id: str) -> None:
    (tmp_path / "hf" / "hub" / f"models--{repo_id.replace('/', '--')}" / "snapshots").mkdir(parents=True)


def test_the_hub_repositories_a_run_reads() -> None:
    config = config_of("--model_name_or_path", "org/encoder", "--tokenizer_name", "org/tok", "--dataset", "org/data")
    assert hub_repositories(config.model, config.data) == [
        ("--model_name_or_path", "org/encoder", "model"),
        ("--tokenizer_name", "org/tok", "model"),
        ("--dataset", "org/data", "dataset"),
    ]
    scratch = config_of("--model_name_or_path", "scratch:bert", "--dataset", "demo")
    assert hub_repositories(scratch.model, scratch.data) == []


def test_offline_or_local_asks_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub_reach, "hub_info", lambda *a: pytest.fail("asked the hub"))
    config = config_of("--model_name_or_path", "org/encoder")
    assert reach_the_hub(config.model, config.data, {**online(tmp_path), "HF_HUB_OFFLINE": "1"})[1] == []
    local = config_of("--model_name_or_path", str(tmp_path), "--dataset", "demo")
    assert reach_the_hub(local.model, local.data, online(tmp_path)) == (online(tmp_path), [])


def test_each_answer_of_the_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_of("--model_name_or_path", "org/encoder")

    def unreachable(*args: object) -> None:
        raise ConnectionError("Connection refused")

    monkeypatch.setattr(hub_reach, "hub_info", unreachable)
    with pytest.raises(EnvironmentProblem, match=r"--model_name_or_path='org/encoder': the hub is unreachable \("):
        reach_the_hub(config.model, config.data, online(tmp_path))
    cache(tmp_path, "org/encoder")  # cached: the run goes on offline, said once
    environ, said = reach_the_hub(config.model, config.data, online(tmp_path))
    assert environ["HF_HUB_OFFLINE"] == "1" and len(said) == 1 and "org/encoder in the cache" in said[0]

    def not_found(*args: object) -> None:
        raise RepositoryNotFoundError("404", response=SimpleNamespace(headers={}, status_code=404, request=None))

    monkeypatch.setattr(hub_reach, "hub_info", not_found)
    with pytest.raises(ConfigError, match="not on the hub"):
        reach_the_hub(config.model, config.data, online(tmp_path))
    monkeypatch.setattr(hub_reach, "hub_info", lambda *args: None)
    assert reach_the_hub(config.model, config.data, online(tmp_path)) == (online(tmp_path), [])
