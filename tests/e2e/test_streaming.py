"""A streamed corpus through the real front door: two ranks with DataLoader workers, preempted and resumed on as many
ranks (the same weights, bit for bit), and resumed on one rank from two and on two from one (the old ranks'
positions redistributed, train/data/stream_resume.py: the losses go on as the uninterrupted run's, within 2 %).
A single rank that is not itself under test (the one-rank run resumed from, the one rank resuming, the one-rank
refusal) is the job's main() in this process: a launch's start-up is seconds of CPU."""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import tiny_env
from tests.data.helpers import write_shards
from tests.e2e.runs import continues, entrypoint, logged_losses, records, start, wait_for
from train.outputs.runfiles import STREAM_STATE

pytestmark = pytest.mark.slow

# Four gzipped files of distinct lines: each of the two ranks reads two, each through two DataLoader workers.
STREAMED = {
    "streaming": "true",
    "max_steps": "30",
    "save_strategy": "steps",
    "save_steps": "10",
    "per_device_train_batch_size": "8",
    "max_eval_samples": "16",
    "eval_strategy": "no",
    "nproc_per_node": "2",
    "dataloader_num_workers": "2",
    "logging_steps": "5",
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("stream") / "corpus"
    write_shards(directory, shards=4, per_shard=150)
    return directory


@pytest.fixture(scope="module")
def straight(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run on two ranks: its output directory (checkpoints 20 and 30 kept)."""
    output = tmp_path_factory.mktemp("straight") / "out"
    env = tiny_env(output, dataset=str(corpus), **STREAMED)
    done = entrypoint(env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return output


def test_a_preempted_stream_resumes_where_it_stopped_and_ends_with_identical_weights(
    tmp_path: Path, corpus: Path, straight: Path
) -> None:
    output = tmp_path / "b"
    env = tiny_env(output, dataset=str(corpus), **STREAMED)
    process = start(env=env)
    wait_for(output / "checkpoint-10" / ".complete", process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 75, stderr[-3000:]
    saved = json.loads((output / "checkpoint-10" / STREAM_STATE).read_text())
    assert saved["world_size"] == 2 and all(saved["ranks"])

    time.sleep(0.1)
    resumed = entrypoint(env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr and "stream starts over" not in resumed.stderr
    # Same examples in the same order on every rank (and the same masks): the same weights, bit for bit.
    first = (straight / "final" / "model.safetensors").read_bytes()
    assert (output / "final" / "model.safetensors").read_bytes() == first


def went_on(checkpoint: Path, output: Path, said: str, from_ranks: int) -> dict[int, float]:
    """A resume of ``checkpoint`` (copied into ``output``, a directory of its own) that said ``said``: it resumed from
    it with the stream's positions and logged ``from_ranks`` as the old world size; the losses it logged."""
    assert f"resuming from {output / checkpoint.name}" in said and "stream starts over" not in said
    banners = [r for r in records(output / "logs" / "train.jsonl") if r.get("event") == "banner"]
    assert banners[-1]["resumed_from_ranks"] == from_ranks
    return logged_losses(output)


def test_a_stream_of_two_ranks_resumes_on_one(
    tmp_path: Path, corpus: Path, straight: Path, job_in_process: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one rank that resumes is the job's main() in this process: what is under test is how the two old ranks'
    positions are redistributed (train/data/stream_resume.py), not a process of its own."""
    output, checkpoint = tmp_path / "one", straight / "checkpoint-20"
    shutil.copytree(checkpoint, output / checkpoint.name)
    capsys.readouterr()
    code = job_in_process(tiny_env(output, dataset=str(corpus), **{**STREAMED, "nproc_per_node": "1"}))
    said = capsys.readouterr()
    assert code == 0, said.err[-3000:]
    continues(went_on(checkpoint, output, said.out + said.err, 2), logged_losses(straight), steps=[25, 30])


def test_a_stream_of_one_rank_resumes_on_two(
    tmp_path: Path, corpus: Path, job_in_process: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one-rank run resumed from is the job's main() in this process; the two ranks resuming it are real."""
    one = {**STREAMED, "nproc_per_node": "1", "max_steps": "20"}
    alone = tmp_path / "alone"  # the global batch of the two-rank runs: 1 rank x 8 x 2 accumulation steps
    capsys.readouterr()
    code = job_in_process(tiny_env(alone, dataset=str(corpus), gradient_accumulation_steps="2", **one))
    assert code == 0, capsys.readouterr().err[-3000:]
    output, checkpoint = tmp_path / "two", alone / "checkpoint-10"
    shutil.copytree(checkpoint, output / checkpoint.name)
    resumed = entrypoint(env=tiny_env(output, dataset=str(corpus), **{**one, "nproc_per_node": "2"}))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    continues(went_on(checkpoint, output, resumed.stdout + resumed.stderr, 1), logged_losses(alone), steps=[15, 20])


def test_a_stream_left_empty_by_its_held_out_examples_is_exit_2_without_a_final_model(
    tmp_path: Path, corpus: Path, job_in_process: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every example held out for evaluation (600 lines, the first 1,000 asked for): the Trainer would only warn and
    end its epoch at step 0, and an untrained model would be published as finished. Refused before training (the
    rank's decision: the job's main() in this process)."""
    output = tmp_path / "out"
    options = {**STREAMED, "max_eval_samples": "1000", "nproc_per_node": "1", "dataloader_num_workers": "0"}
    capsys.readouterr()
    assert job_in_process(tiny_env(output, dataset=str(corpus), **options)) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "MLM_STREAMING=true: the training stream gave no example: " in errors[0], errors
    assert "MLM_MAX_EVAL_SAMPLES=1000 holds out the stream's first 1,000 examples" in errors[0]
    assert not (output / "final").exists() and not list(output.glob("checkpoint-*"))


def test_a_stream_that_leaves_a_rank_nothing_is_exit_2_on_every_rank_at_once(tmp_path: Path) -> None:
    """One line on two ranks: rank 1's part is empty. It would stop at once while rank 0 waited for it in the
    gradient all-reduce until ddp_timeout (60 s here), then crashed with "connection closed by peer" (exit 1)."""
    (tmp_path / "one.txt").write_text("the only line of training text in this corpus\n")
    (tmp_path / "held.txt").write_text("a held-out line of text\n")
    options = {**STREAMED, "validation_file": str(tmp_path / "held.txt"), "ddp_timeout": "60", "log_ranks": "all"}
    options["dataloader_num_workers"] = "0"
    done = entrypoint(env=tiny_env(tmp_path / "out", dataset=str(tmp_path / "one.txt"), **options), timeout=50)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert errors and all("the training stream gives rank(s) 1 of 2 no example" in line for line in errors), errors
    assert "or fewer ranks)" in errors[0] and "crashed" not in done.stderr
