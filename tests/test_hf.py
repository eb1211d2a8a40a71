"""train.hf: the one rule for HF_HOME, the hub cache, offline mode and local paths, checked against huggingface_hub."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from train import hf
from train.data import BUILDERS


def test_hf_home_follows_huggingface_hub(monkeypatch, tmp_path):
    import huggingface_hub.constants as constants

    cases = [
        {"HF_HOME": str(tmp_path / "home")},
        {"XDG_CACHE_HOME": str(tmp_path / "xdg")},
        {"HF_HOME": str(tmp_path / "home"), "HF_HUB_CACHE": str(tmp_path / "elsewhere")},
        {},
    ]
    try:
        for environ in cases:
            for name in ("HF_HOME", "XDG_CACHE_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
                monkeypatch.delenv(name, raising=False)
            for name, value in environ.items():
                monkeypatch.setenv(name, value)
            importlib.reload(constants)  # the library reads the environment once, at import
            assert hf.hf_home(environ) == Path(constants.HF_HOME)
            assert hf.hub_cache(environ) == Path(constants.HF_HUB_CACHE)
    finally:
        monkeypatch.undo()
        importlib.reload(constants)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, False),
        ({"HF_HUB_OFFLINE": "1"}, True),
        ({"HF_HUB_OFFLINE": "yes"}, True),
        ({"HF_HUB_OFFLINE": "ON"}, True),
        ({"HF_HUB_OFFLINE": "0"}, False),
        ({"HF_HUB_OFFLINE": "false"}, False),
        ({"TRANSFORMERS_OFFLINE": "1"}, True),
        ({"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"}, False),  # the first one set wins, as in the library
    ],
)
def test_offline(environ, expected):
    assert hf.offline(environ) is expected


def test_our_cache_is_inside_hf_home(tmp_path):
    assert hf.cache_root({"HF_HOME": str(tmp_path)}) == tmp_path / "mlm-trainer"


def test_looks_local(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hf.looks_local("./data") and hf.looks_local("/data") and hf.looks_local("~/x")
    assert hf.looks_local("corpus.jsonl") and not hf.looks_local("org/dataset")
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "dataset").mkdir()
    assert hf.looks_local("org/dataset")  # an existing path wins over a hub id


def test_local_suffixes_are_the_formats_data_reads():
    assert set(hf.LOCAL_SUFFIXES) == set(BUILDERS)


def test_in_hub_cache(tmp_path):
    environ = {"HF_HOME": str(tmp_path)}
    assert not hf.in_hub_cache("org/model", "model", environ)
    (tmp_path / "hub" / "models--org--model" / "snapshots").mkdir(parents=True)
    assert hf.in_hub_cache("org/model", "model", environ)
    (tmp_path / "mlm-trainer" / "raw" / "org___data").mkdir(parents=True)
    assert hf.in_hub_cache("org/data", "dataset", environ)
