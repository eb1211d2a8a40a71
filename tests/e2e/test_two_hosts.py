"""Two hosts for real: the multi-node-indexed overlay's pods on two network namespaces joined by a veth pair.

Each namespace is one "node" with its own address; entrypoint.sh runs in each with the environment the Job
controller gives pod 0 and pod 1 of k8s/overlays/multi-node-indexed, changed only where this machine differs from
a GPU cluster (stated in ``node_env``). The nodes share the claims' directories (/output, /cache, /data) as a
ReadWriteMany volume would be shared, and each has its own /tmp. Needs root for ``ip netns``; skipped, with the reason,
only where a namespace cannot be created.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, tiny_env
from tests.e2e.k8s_manifests import mount_paths, pod_for_node, relocate, render
from tests.e2e.netns_hosts import Host, hosts
from tests.e2e.runs import ENTRYPOINT

pytestmark = pytest.mark.slow

# The cluster's own variables: none may leak in from the shell running the tests.
CLUSTER_ENV = re.compile(r"^(PET_|MASTER_|NNODES$|NODE_RANK$|JOB_COMPLETION_INDEX$|WORLD_SIZE$|RANK$|LOCAL_RANK$)")
# How long node 0 may take to notice that node 1 is gone (a hang would never end).
LOSS_DETECTION_BOUND_S = 180
# A logged training step, e.g. {'loss': '8.637', ...} (not an option name such as prediction_loss_only).
TRAINING_STEP = re.compile(r"""['"]loss['"]: """)


@pytest.fixture(scope="module")
def indexed_job() -> list[dict]:
    return render("multi-node-indexed")


@pytest.fixture
def two_hosts():
    with hosts(2) as made:
        yield made


def node_env(docs: list[dict], rank: int, host: Host, master: Host, root: Path, **options: str) -> dict[str, str]:
    """Pod ``rank``'s environment from the overlay, on this CPU-only machine."""
    pod = pod_for_node(docs, rank)
    env = relocate(pod.env, mount_paths(pod.template, root / "claims", root / f"pod-{rank}"))
    # The tiny demo preset (tiny_env's MLM_CONFIG) instead of /data and a hub model, which are offline here.
    for name in ("MLM_CONFIG", "MLM_DATASET", "MLM_MODEL_NAME_OR_PATH"):
        env.pop(name)
    env.update(
        # No GPU here: one CPU process per node (gloo), instead of one per GPU (nccl).
        MLM_REQUIRE_GPU="false",
        MLM_NPROC_PER_NODE="1",
        # Node 0's address instead of its DNS name mlm-trainer-0.mlm-trainer (there is no cluster DNS here).
        MASTER_ADDR=master.address,
        # gloo finds its own address by resolving the hostname, which a pod's /etc/hosts maps to the pod IP;
        # namespaces share the machine's hostname, so name the interface instead.
        GLOO_SOCKET_IFNAME=host.interface,
        # Two nodes on a shared 2-core machine.
        OMP_NUM_THREADS="1",
    )
    env.update({f"MLM_{k.upper()}": v for k, v in options.items()})
    base = tiny_env(Path(env["MLM_OUTPUT_DIR"]))
    base = {k: v for k, v in base.items() if not CLUSTER_ENV.match(k)}
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"  # entrypoint.sh's python3
    return {**base, **env}


def start_nodes(docs: list[dict], pair: list[Host], root: Path, **options: str) -> list[tuple[subprocess.Popen, Path]]:
    started = []
    for rank, host in enumerate(pair):
        log = root / f"node-{rank}.log"
        env = node_env(docs, rank, host, pair[0], root, **options)
        with log.open("w") as out:
            process = host.start([str(ENTRYPOINT), "train"], env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        started.append((process, log))
    return started


def test_two_nodes_train_to_the_end(indexed_job, two_hosts, tmp_path):
    nodes = start_nodes(indexed_job, two_hosts, tmp_path)
    for rank, (process, log) in enumerate(nodes):
        try:
            process.wait(timeout=900)
        except subprocess.TimeoutExpired:
            pytest.fail(f"node {rank} still running after 900 s:\n{log.read_text()[-4000:]}")
    for rank, (process, log) in enumerate(nodes):
        assert process.returncode == 0, f"node {rank} exited {process.returncode}:\n{log.read_text()[-4000:]}"

    output = tmp_path / "claims" / "output"
    node1 = nodes[1][1].read_text()
    # Node 1 met node 0 at its address in the other namespace, as pod 1 of the Indexed Job.
    assert f"--node-rank 1 --master-addr {two_hosts[0].address} --master-port 29500" in node1
    run = json.loads((output / "run.json").read_text())
    assert run["world_size"] == 2
    assert run["status"] == "finished"
    # One final/ on the shared volume, written once (by global rank 0).
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("final") if p.is_dir()) == [
        Path("claims/output/final")
    ]
    assert (output / "final" / "model.safetensors").exists()


def test_losing_node_1_stops_node_0(indexed_job, two_hosts, tmp_path):
    # Far more steps than the test waits for: node 1 is lost mid-training.
    nodes = start_nodes(
        indexed_job,
        two_hosts,
        tmp_path,
        max_steps="100000",
        logging_steps="1",
        eval_strategy="no",
        save_strategy="no",
    )
    (node0, log0), (node1, log1) = nodes
    deadline = time.monotonic() + 600
    while not TRAINING_STEP.search(log0.read_text()):
        assert node0.poll() is None and node1.poll() is None, (
            f"a node stopped before training:\n{log0.read_text()[-3000:]}\n{log1.read_text()[-3000:]}"
        )
        assert time.monotonic() < deadline, f"no training step within 600 s:\n{log0.read_text()[-3000:]}"
        time.sleep(0.5)

    two_hosts[1].kill_all()  # every process of node 1 at once, as when its pod is killed
    try:
        node0.wait(timeout=LOSS_DETECTION_BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"node 0 still running {LOSS_DETECTION_BOUND_S} s after node 1 died:\n{log0.read_text()[-4000:]}")
    text = log0.read_text()
    assert node0.returncode not in (0, None), text[-4000:]
    # Not counted as preemption (75) nor as a configuration/environment error: a crash, which the Job retries.
    assert node0.returncode not in (2, 3, 75), text[-4000:]
    # Node 0 names the peer it lost (gloo: "Connection closed by peer [<node 1's address>]"), and the launcher's
    # last line gives the exit: a rank said why in the line above it.
    assert two_hosts[1].address in text, text[-4000:]
    last = text.strip().splitlines()[-1]
    assert "exit 1: a rank crashed" in last and "error" in last, last
