"""Bad input through ./entrypoint.sh, one case per way it ends a run (refused by the launcher, by a rank under
torchrun, an unwritable output): one error line naming the variable or file and what is expected, the documented
exit code, no traceback, no final/, and earlier checkpoints untouched."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
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


def write(path: Path, content: bytes | str) -> str:
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return str(path)


# One case per way a bad input ends a run, each through the whole launcher (the messages of every other case are
# checked where they are decided: tests/config/, tests/data/, tests/launch/, tests/test_outputs.py,
# tests/test_model_source.py, tests/test_bad_input.py).
CASES = [
    # an option refused by the launcher, before torchrun: exit 2
    Case(
        "batch size not an integer",
        lambda t: {"MLM_PER_DEVICE_TRAIN_BATCH_SIZE": "lots"},
        2,
        "MLM_PER_DEVICE_TRAIN_BATCH_SIZE='lots': expected an integer",
    ),
    # data refused by the rank reading it, under torchrun: exit 2 through torchrun, its failure report dropped
    Case(
        "corrupt JSONL line",
        lambda t: {"MLM_DATASET": write(t / "c.jsonl", '{"text": "a"}\n{"text": \n')},
        2,
        "c.jsonl': cannot be read",
    ),
    # a hub model while the hub is unreachable (nothing listens on the port): the launcher's one request, exit 3
    # before torchrun, instead of the rank's retries (53 s) after the data
    Case(
        "hub unreachable",
        lambda t: {
            "HF_HUB_OFFLINE": "0",
            "HF_ENDPOINT": "http://127.0.0.1:9",
            "MLM_MODEL_NAME_OR_PATH": "someone/encoder",
        },  # fmt: skip
        3,
        "MLM_MODEL_NAME_OR_PATH='someone/encoder': the hub is unreachable (",
    ),
    # an output_dir the launcher cannot write: exit 3
    Case(
        "output dir not writable",
        lambda t: {"MLM_OUTPUT_DIR": str(Path(write(t / "f", "")) / "out")},
        3,
        "not writable",
    ),
]


def tree_digest(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, tmp_path: Path) -> None:
    output = tmp_path / "output"
    checkpoint = output / "checkpoint-5"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(os.urandom(256))
    (checkpoint / ".complete").write_text("earlier run\n")
    before = tree_digest(output)

    env = tiny_env(output)
    env.update(case.env(tmp_path))
    result = entrypoint(env=env, cwd=tmp_path)

    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert result.returncode == case.code, result.stderr[-2000:]
    assert len(errors) == 1, result.stderr[-2000:]
    assert case.message in errors[0], errors
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert not (output / "final").exists() and not list(output.glob(".final*"))
    assert {k: v for k, v in tree_digest(output).items() if k in before} == before


def test_a_link_planted_in_the_output_directory_is_refused_and_nothing_is_written_through_it(tmp_path: Path) -> None:
    """Someone with write access to the output volume links the run's log to a file outside it: the launcher
    refuses the directory in one line (exit 2) before any rank starts, and the file outside is untouched."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept.txt").write_text("not the run's\n")
    output = tmp_path / "output"
    (output / "logs").mkdir(parents=True)
    (output / "logs" / "train.jsonl").symlink_to(outside / "kept.txt")
    result = entrypoint(env=tiny_env(output), cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "logs/train.jsonl (to " in result.stderr and "is a symbolic link inside it" in result.stderr
    assert "Traceback" not in result.stderr and "torchrun:" not in result.stderr
    assert (outside / "kept.txt").read_text() == "not the run's\n" and sorted(os.listdir(outside)) == ["kept.txt"]
