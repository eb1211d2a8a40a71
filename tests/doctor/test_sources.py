"""Model, tokenizer and dataset: local paths (train.common.hf.looks_local), the hub, the caches and offline mode
(train.common.hf)."""

from __future__ import annotations

from types import SimpleNamespace

from huggingface_hub.errors import RepositoryNotFoundError

from tests.doctor.helpers import checks
from tests.fakes import no_driver
from train.common import hub_reach


def test_offline_hub_model_not_cached_fails_then_cached_passes(env, tmp_path, monkeypatch):
    no_driver(monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MLM_MODEL_NAME_OR_PATH", "org/model")
    found = checks()["model"]
    assert found.status == "FAIL" and "offline" in found.detail
    (tmp_path / "hf" / "hub" / "models--org--model" / "snapshots").mkdir(parents=True)
    assert checks()["model"].status == "OK"


def test_offline_dataset_found_in_our_raw_cache(env, tmp_path, monkeypatch):
    no_driver(monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MLM_DATASET", "org/data")
    assert checks()["dataset"].status == "FAIL"
    (tmp_path / "hf" / "mlm-trainer" / "raw" / "org___data").mkdir(parents=True)
    assert checks()["dataset"].status == "OK"


def test_online_hub_answers(env, monkeypatch):
    no_driver(monkeypatch)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    asked: list[tuple[str, str]] = []
    monkeypatch.setattr(hub_reach, "hub_info", lambda repo, kind, timeout: asked.append((repo, kind)))
    monkeypatch.setenv("MLM_MODEL_NAME_OR_PATH", "org/model")
    monkeypatch.setenv("MLM_DATASET", "org/data")
    found = checks()
    assert found["model"].status == "OK" and found["dataset"].status == "OK"
    assert asked == [("org/model", "model"), ("org/data", "dataset")]


def test_hub_unknown_repo_and_unreachable_hub(env, tmp_path, monkeypatch):
    no_driver(monkeypatch)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("MLM_MODEL_NAME_OR_PATH", "org/model")

    def not_found(repo, kind, timeout):
        raise RepositoryNotFoundError("404", response=SimpleNamespace(headers={}, status_code=404, request=None))

    monkeypatch.setattr(hub_reach, "hub_info", not_found)
    found = checks()["model"]
    assert found.status == "FAIL" and "not on the hub" in found.detail and "HF_TOKEN_FILE" in found.fix

    def unreachable(repo, kind, timeout):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(hub_reach, "hub_info", unreachable)
    assert checks()["model"].status == "FAIL"
    (tmp_path / "hf" / "hub" / "models--org--model" / "snapshots").mkdir(parents=True)
    cached = checks()["model"]
    assert cached.status == "WARN" and "HF_HUB_OFFLINE=1" in cached.fix


def test_local_model_and_data(env, tmp_path, monkeypatch):
    no_driver(monkeypatch)
    monkeypatch.setenv("MLM_MODEL_NAME_OR_PATH", str(tmp_path / "model"))
    monkeypatch.setenv("MLM_DATASET", str(tmp_path / "train.txt"))
    found = checks()
    assert found["model"].status == "FAIL" and found["dataset"].status == "FAIL"
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "train.txt").write_text("hello\n")
    found = checks()
    # Only a config.json: an architecture trained from scratch (train.config.model_source), and this one has no type.
    assert found["model"].status == "FAIL" and "no model_type" in found["model"].detail
    assert found["dataset"].status == "OK"
    (tmp_path / "model" / "config.json").write_text('{"model_type": "bert"}')
    found = checks()["model"]
    assert found.status == "OK" and found.detail.endswith(
        "(config.json only, no weights), trained from scratch, nothing to download"
    )
    (tmp_path / "model" / "model.safetensors").write_bytes(b"")
    found = checks()["model"]
    assert found.status == "OK" and "from its pretrained weights in a local directory" in found.detail


def test_tokenizer_directory_and_missing_validation_file(env, tmp_path, monkeypatch):
    no_driver(monkeypatch)
    (tmp_path / "tok").mkdir()
    monkeypatch.setenv("MLM_TOKENIZER_NAME", str(tmp_path / "tok"))
    monkeypatch.setenv("MLM_VALIDATION_FILE", str(tmp_path / "valid.txt"))
    found = checks()
    assert found["tokenizer"].status == "OK"
    assert found["dataset"].status == "FAIL" and "MLM_VALIDATION_FILE" in found["dataset"].fix


def test_unknown_scratch_model_type_fails(env, monkeypatch):
    no_driver(monkeypatch)
    monkeypatch.setenv("MLM_MODEL_NAME_OR_PATH", "scratch:nosuchmodel")
    found = checks()["model"]
    assert found.status == "FAIL" and "unknown model type 'nosuchmodel'" in found.detail


def test_a_tokenizer_file_is_not_a_tokenizer_directory(env, tmp_path, monkeypatch):
    no_driver(monkeypatch)
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setenv("MLM_TOKENIZER_NAME", str(tmp_path / "tokenizer.json"))
    found = checks()["tokenizer"]
    assert found.status == "FAIL" and "not a directory" in found.detail
