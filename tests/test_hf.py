"""train.common.hf: the one rule for HF_HOME, the hub cache, offline mode and local paths, checked against huggingface_hub."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from train.common import hf


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
    """One list: every file the readers take is local by its name, compressed or not (tests/data/test_sources.py
    checks that the readers take exactly these)."""
    assert set(hf.LOCAL_SUFFIXES) == set(hf.BUILDERS) | set(hf.COMPRESSIONS)
    assert hf.looks_local("corpus.jsonl.zst") and hf.looks_local("part-0.txt.gz") and hf.looks_local("c.CSV.BZ2")
    assert not hf.looks_local("org/corpus") and not hf.looks_local("org/corpus-v1.5")


def test_in_hub_cache(tmp_path):
    environ = {"HF_HOME": str(tmp_path)}
    assert not hf.in_hub_cache("org/model", "model", environ)
    (tmp_path / "hub" / "models--org--model" / "snapshots").mkdir(parents=True)
    assert hf.in_hub_cache("org/model", "model", environ)
    (tmp_path / "mlm-trainer" / "raw" / "org___data").mkdir(parents=True)
    assert hf.in_hub_cache("org/data", "dataset", environ)


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"KUBEFLOW_TRAINER_SERVER_URL": "http://trainer:8080"},
        {"KUBEFLOW_TRAINER_SERVER_URL": ""},
        {"KUBEFLOW_TRAINER_SERVER_URL": "http://trainer:8080", "DISABLE_KUBEFLOW_INTEGRATION": "true"},
        {"KUBEFLOW_TRAINER_SERVER_URL": "http://trainer:8080", "DISABLE_KUBEFLOW_INTEGRATION": "0"},
    ],
)
def test_the_kubeflow_rule_is_transformers_own(monkeypatch, environ):
    from transformers.integrations.integration_utils import is_kubeflow_available

    for name in ("KUBEFLOW_TRAINER_SERVER_URL", "DISABLE_KUBEFLOW_INTEGRATION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert hf.kubeflow_trainer_progress() == is_kubeflow_available()
    assert hf.kubeflow_trainer_progress(environ) == is_kubeflow_available()


# The launcher's arguments built twice in one process (an interpreter's start and the imports are most of the
# test's time): without, then with the Kubeflow trainer's variable, which transformers reads at each call.
LAUNCHER_IMPORTS = """
import json, os, sys
from train.launch.plan import launcher_config
for url in (None, "http://trainer:8080"):
    if url:
        os.environ["KUBEFLOW_TRAINER_SERVER_URL"] = url
    config = launcher_config(["--report_to", "tensorboard"], {})
    print(json.dumps({"report_to": config.training.report_to,
                      "modeling_utils": "transformers.modeling_utils" in sys.modules}))
import transformers.integrations as integrations
from transformers.integrations import is_kubeflow_available
print(json.dumps({"module": is_kubeflow_available.__module__}))
"""


def test_the_launcher_builds_its_arguments_without_transformers_model_code(tmp_path):
    """The launcher's TrainingArguments come without modeling_utils (1.6 s), and answer the Kubeflow question as
    transformers does; after the block the lazy module resolves the library's own function again."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLM_", "KUBEFLOW", "DISABLE_KUBEFLOW"))}
    env.update(HF_HOME=str(tmp_path / "hf"), MLM_OUTPUT_DIR=str(tmp_path / "out"))
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHER_IMPORTS], env=env, capture_output=True, text=True, check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip
    without, with_url, resolved = (json.loads(line) for line in done.stdout.splitlines()[-3:])
    assert without["modeling_utils"] is False and with_url["modeling_utils"] is False
    assert without["report_to"] == ["tensorboard"]
    assert with_url["report_to"] == ["tensorboard", "kubeflow"]
    assert resolved["module"] == "transformers.integrations.integration_utils"
