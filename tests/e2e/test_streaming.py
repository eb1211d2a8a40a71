"""A streamed corpus through the real front door: two ranks with DataLoader workers, preempted and resumed."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import tiny_env
from tests.data.helpers import write_shards
from tests.e2e.runs import entrypoint, start, wait_for
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


def test_a_preempted_stream_resumes_where_it_stopped_and_ends_with_identical_weights(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    write_shards(corpus, shards=4, per_shard=150)
    straight = entrypoint(env=tiny_env(tmp_path / "a", dataset=str(corpus), **STREAMED))
    assert straight.returncode == 0, straight.stderr[-3000:]

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
    first = (tmp_path / "a" / "final" / "model.safetensors").read_bytes()
    assert (output / "final" / "model.safetensors").read_bytes() == first
