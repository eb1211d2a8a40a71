"""The bad-input matrix: each case through ./entrypoint.sh gives one error line naming the variable or file and
what is expected, the documented exit code, no traceback, no final/, and earlier checkpoints untouched."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import tiny_env
from tests.e2e.runs import entrypoint

pytestmark = pytest.mark.slow


@dataclass
class Case:
    name: str
    env: Callable[[Path], dict[str, str]]  # extra environment, given a scratch folder
    code: int
    message: str  # a substring of the error line
    as_user: bool = False  # run without root's power to read any file
    drop: tuple[str, ...] = field(default=())  # variables to remove from the tiny run's environment


def write(path: Path, content: bytes | str) -> str:
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return str(path)


def small_full_tmpfs(tmp: Path) -> str:
    mount = tmp / "full"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    subprocess.run(["dd", "if=/dev/zero", f"of={mount / 'filler'}", "bs=4k"], capture_output=True)
    return str(mount / "out")


def unreadable(tmp: Path) -> str:
    path = Path(write(tmp / "secret.txt", "some text\n"))
    path.chmod(0)
    return str(path)


CASES = [
    Case(
        "batch size not an integer",
        lambda t: {"MLM_PER_DEVICE_TRAIN_BATCH_SIZE": "lots"},
        2,
        "MLM_PER_DEVICE_TRAIN_BATCH_SIZE='lots': expected an integer",
    ),
    Case(
        "negative epochs",
        lambda t: {"MLM_NUM_TRAIN_EPOCHS": "-2"},
        2,
        "MLM_NUM_TRAIN_EPOCHS=-2.0: expected a positive number",
    ),
    Case(
        "misspelt variable",
        lambda t: {"MLM_LEARNIGN_RATE": "1e-4"},
        2,
        "MLM_LEARNIGN_RATE: unknown option; did you mean MLM_LEARNING_RATE?",
    ),
    Case(
        "mlm_probability outside (0, 1)",
        lambda t: {"MLM_MLM_PROBABILITY": "1.2"},
        2,
        "MLM_MLM_PROBABILITY=1.2: expected a number between 0 and 1",
    ),
    Case(
        "max_seq_length beyond the model's positions",
        lambda t: {"MLM_MAX_SEQ_LENGTH": "1024"},
        2,
        "MLM_MAX_SEQ_LENGTH=1024: expected at most 512",
    ),
    Case(
        "missing data path",
        lambda t: {"MLM_DATASET": str(t / "missing.txt")},
        2,
        "missing.txt': no such file or directory",
    ),
    Case("empty data file", lambda t: {"MLM_DATASET": write(t / "empty.txt", "")}, 2, "the file is empty"),
    Case(
        "no text column",
        lambda t: {"MLM_DATASET": write(t / "x.jsonl", '{"body": "hi"}\n')},
        2,
        "no column 'text' (columns: body); set MLM_TEXT_COLUMN",
    ),
    Case(
        "unsupported extension",
        lambda t: {"MLM_DATASET": write(t / "x.docx", "hi")},
        2,
        "unsupported extension '.docx'",
    ),
    Case(
        "corrupt JSONL line",
        lambda t: {"MLM_DATASET": write(t / "c.jsonl", '{"text": "a"}\n{"text": \n')},
        2,
        "c.jsonl': cannot be read",
    ),
    Case(
        "corrupt Parquet",
        lambda t: {"MLM_DATASET": write(t / "c.parquet", b"PAR1garbage")},
        2,
        "c.parquet': cannot be read",
    ),
    Case("unreadable file", lambda t: {"MLM_DATASET": unreadable(t)}, 2, "secret.txt': not readable", as_user=True),
    Case(
        "output dir not writable",
        lambda t: {"MLM_OUTPUT_DIR": str(Path(write(t / "f", "")) / "out")},
        3,
        "not writable",
    ),
    Case(
        "no space left on the output device",
        lambda t: {"MLM_OUTPUT_DIR": small_full_tmpfs(t)},
        3,
        "no space left on the device",
    ),
    Case(
        "missing local model",
        lambda t: {"MLM_MODEL_NAME_OR_PATH": str(t / "no-model")},
        2,
        "no-model': no such local model directory",
    ),
    Case(
        "hub model offline, not cached",
        lambda t: {"MLM_MODEL_NAME_OR_PATH": "someone/bert-nowhere"},
        2,
        "HF_HUB_OFFLINE is set and the tokenizer is not in the cache",
    ),
    Case("missing YAML config", lambda t: {"MLM_CONFIG": str(t / "none.yaml")}, 2, "none.yaml'; expected a YAML file"),
    Case(
        "invalid YAML config",
        lambda t: {"MLM_CONFIG": write(t / "bad.yaml", "seed: [1,\n")},
        2,
        "bad.yaml: not valid YAML",
    ),
    Case(
        "unknown YAML key",
        lambda t: {"MLM_CONFIG": write(t / "k.yaml", "learning_rat: 0.1\n")},
        2,
        "unknown option 'learning_rat'; did you mean learning_rate?",
    ),
    Case(
        "duplicate YAML key",
        lambda t: {"MLM_CONFIG": write(t / "d.yaml", "seed: 1\nlearning_rate: 0.001\nseed: 2\n")},
        2,
        "d.yaml: 'seed' is set twice (lines 1 and 3)",
    ),
    Case(
        "non-finite learning rate",
        lambda t: {"MLM_LEARNING_RATE": "nan"},
        2,
        "MLM_LEARNING_RATE=nan: expected a finite number",
    ),
    Case(
        "master port out of range",
        lambda t: {"MASTER_PORT": "70000"},
        2,
        "MASTER_PORT='70000': expected an integer from 1 to 65535",
    ),
    Case(
        "no row with text",
        lambda t: {"MLM_DATASET": write(t / "nulls.jsonl", '{"text": null}\n{"text": null}\n')},
        2,
        "nulls.jsonl': no text: column 'text' is null or not a string in all 2 rows",
    ),
    Case("fp16 on CPU", lambda t: {"MLM_FP16": "true"}, 2, "MLM_FP16: fp16 needs a GPU"),
    Case(
        "global batch that does not divide", lambda t: {"MLM_GLOBAL_BATCH_SIZE": "100"}, 2, "MLM_GLOBAL_BATCH_SIZE=100"
    ),
    Case("HF_TOKEN_FILE missing", lambda t: {"HF_TOKEN_FILE": str(t / "token")}, 2, "HF_TOKEN_FILE="),
    Case(
        "HF_TOKEN and HF_TOKEN_FILE both set",
        lambda t: {"HF_TOKEN": "hf_x", "HF_TOKEN_FILE": write(t / "token", "hf_y")},
        2,
        "both HF_TOKEN and HF_TOKEN_FILE are set",
    ),
]


def tree_digest(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, tmp_path: Path, hf_home: Path, request: pytest.FixtureRequest) -> None:
    # The small-filesystem case mounts a tmpfs under tmp_path: unmount it whatever happens.
    request.addfinalizer(lambda: subprocess.run(["umount", str(tmp_path / "full")], capture_output=True))
    output = tmp_path / "output"
    checkpoint = output / "checkpoint-5"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(os.urandom(256))
    (checkpoint / ".complete").write_text("earlier run\n")
    before = tree_digest(output)

    env = tiny_env(output)
    env.update(case.env(tmp_path))
    wrapper: list[str] = []
    if case.as_user:
        # Root reads any file through CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH: drop them to see what a user sees.
        if os.geteuid() != 0 or shutil.which("setpriv") is None:
            pytest.skip("needs root and setpriv to drop the file-access capabilities")
        caps = "-dac_override,-dac_read_search"
        wrapper = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]
    result = entrypoint(env=env, cwd=tmp_path, wrapper=wrapper)

    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert result.returncode == case.code, result.stderr[-2000:]
    assert len(errors) == 1, result.stderr[-2000:]
    assert case.message in errors[0], errors
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert not (output / "final").exists() and not list(output.glob(".final*"))
    assert {k: v for k, v in tree_digest(output).items() if k in before} == before


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    env = tiny_env(tmp_path / "out", dataset=str(tmp_path / "missing.txt"), debug="1")
    result = entrypoint(env=env)
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "missing.txt" in result.stderr


def test_plan_never_shows_the_token(tmp_path: Path) -> None:
    canary = "hf_canary_plan_789"
    env = tiny_env(tmp_path / "out")
    env["HF_TOKEN"] = canary
    result = entrypoint("plan", "--hub_token", canary, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert canary not in result.stdout + result.stderr
    assert json.loads(result.stdout)["config"]["hub_token"] == "***"
