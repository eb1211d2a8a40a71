"""Two nodes on one machine: two entrypoint.sh processes given what a PyTorchJob gives its master and worker.

Each "node" is one CPU process (gloo) with its own HF cache and output directory, as on two machines; they meet at
127.0.0.1 through torchrun's static rendezvous and train the tiny demo together.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.runs import node_env, start
from tests.servers import free_port

pytestmark = pytest.mark.slow


def train_two_nodes(tmp_path: Path, cache: str = "node") -> list[str]:
    """Both nodes to their end; their logs (node 0's, node 1's), each checked for exit 0."""
    port = free_port()
    nodes = [
        start("train", env=node_env(tmp_path, rank, port, cache), cwd=tmp_path, stderr=subprocess.STDOUT)
        for rank in (0, 1)
    ]
    logs = []
    try:
        for node in nodes:
            logs.append(node.communicate(timeout=900)[0])
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    for rank, (node, log) in enumerate(zip(nodes, logs, strict=True)):
        assert node.returncode == 0, f"node {rank} exited {node.returncode}:\n{log[-4000:]}"
    return logs


SHARED = "is node 0's too (a shared volume): node 0 prepares the data, this node reads it"


def test_two_nodes_train_together_and_write_one_final(tmp_path: Path) -> None:
    logs = train_two_nodes(tmp_path)
    # Each node's own cache: each prepares its data.
    assert SHARED not in logs[1] and "Tokenizing train" in logs[1]
    assert list((tmp_path / "node1/hf/mlm-trainer/tokenized").glob("*.arrow"))

    # The launch banner counts both nodes; torchrun met at the address the PET_* variables gave.
    assert "batch: 64 per device x 1 process x 2 nodes x 1 accumulation = 128 global" in logs[0]
    assert "--node-rank 1 --master-addr 127.0.0.1" in logs[1]
    # A process group without DDP (CPU ranks without use_cpu) trains two unsynchronised copies; transformers says so.
    for log in logs:
        assert "parallel_mode != ParallelMode.DISTRIBUTED" not in log

    finals = sorted(p.relative_to(tmp_path) for p in tmp_path.glob("node*/output/final"))
    assert finals == [Path("node0/output/final")], logs[0][-3000:]
    assert (tmp_path / "node0/output/final/model.safetensors").exists()
    run = json.loads((tmp_path / "node0/output/run.json").read_text())
    assert run["status"] == "finished"
    assert run["world_size"] == 2
    assert run["config"]["use_cpu"] is True and run["config"]["ddp_backend"] == "gloo"
    # The launcher's decisions, handed to the ranks (MLM_LAUNCH), not re-derived there: the command it ran,
    # the node count and the precision.
    assert "--node-rank" in run["command"] and run["command"][run["command"].index("-m") + 1] == "train.run.job"
    assert run["hardware"]["nnodes"] == "2" and run["hardware"]["precision"] == "fp32"
    banner = json.loads((tmp_path / "node0/output/logs/train.jsonl").read_text().splitlines()[0])
    assert (banner["event"], banner["nodes"], banner["launched"]) == ("banner", "2", True)
    assert not (tmp_path / "node1/output/run.json").exists()


def test_nodes_sharing_a_cache_prepare_the_data_once(tmp_path: Path) -> None:
    """One HF_HOME on a volume both nodes see (NFS, a cluster's home): node 0 tokenizes, node 1 waits and reads."""
    logs = train_two_nodes(tmp_path, cache="shared")
    assert f"the cache {tmp_path}/shared/hf/mlm-trainer {SHARED}" in logs[1], logs[1][-3000:]
    assert "Tokenizing train" in logs[0] and "Tokenizing train" not in logs[1], logs[1][-3000:]
    assert not list((tmp_path / "shared/hf/mlm-trainer").glob(".shared-*"))  # the probe is gone
