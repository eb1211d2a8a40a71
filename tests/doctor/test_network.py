"""NCCL result handling, and the rendezvous as train.launch.topology reads it (PET_* first), with the hint
train.launch.rendezvous gives when its address does not resolve."""

from __future__ import annotations

import socket

import pytest
import torch

from train.common.errors import UserError
from train.doctor import network
from train.doctor.machine import TorchView
from train.launch.rendezvous import Lookup, wait_for_address

# ---- NCCL ----------------------------------------------------------------------------------------------------------


def test_nccl_results():
    two = TorchView(version="x", cuda_build="12.4", available=True, count=2)
    assert network.check_nccl(two, None, lambda n: {"busbw_gbps": 3.0}).status == "WARN"

    def hang(n: int) -> dict:
        raise TimeoutError("no result within 120 s")

    failed = network.check_nccl(two, None, hang)
    assert failed.status == "FAIL" and "120 s" in failed.detail and "NCCL_DEBUG=INFO" in failed.fix
    one = TorchView(version="x", cuda_build="12.4", available=True, count=1)
    assert network.check_nccl(one, None, hang).status == "SKIP"


@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="needs a GPU (bench/gpu_check.sh runs it where one is lent)")
def test_nccl_allreduce_on_real_gpus():
    result = network.nccl_allreduce(torch.cuda.device_count(), size_mib=64, iters=5)
    assert result["seconds"] > 0 and result["algbw_gbps"] > 0


# ---- master / rendezvous -------------------------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the block ends: nothing listens there


def test_master_port_closed_fails_and_open_passes():
    port = closed_port()
    environ = {"NNODES": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": "1"}
    found = network.check_master(environ)
    assert found.status == "FAIL" and "start the master node" in found.fix and "MASTER_PORT" in found.fix
    assert "MASTER_ADDR=127.0.0.1" in found.detail
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        environ = {
            "PET_NNODES": "3",
            "PET_MASTER_ADDR": "localhost",
            "PET_MASTER_PORT": str(server.getsockname()[1]),
            "PET_NODE_RANK": "2",
        }
        found = network.check_master(environ)
        assert found.status == "OK" and "PET_MASTER_ADDR=localhost" in found.detail


def test_pet_master_wins_over_master_addr():
    port = closed_port()
    environ = {
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(port),
        "MASTER_ADDR": "no-such-host.invalid",
        "MASTER_PORT": "29500",
    }
    found = network.check_master(environ)
    assert found.data["host"] == "127.0.0.1" and found.data["port"] == port
    assert "PET_MASTER_ADDR=127.0.0.1" in found.detail and "does not resolve" not in found.detail


def test_master_address_that_does_not_resolve_fails():
    environ = {"NNODES": "2", "MASTER_ADDR": "no-such-host.invalid", "MASTER_PORT": "29500", "NODE_RANK": "1"}
    found = network.check_master(environ)
    assert found.status == "FAIL" and "does not resolve" in found.detail
    assert found.fix == "set MASTER_ADDR to node 0's host name or IP address as this node reaches it"


@pytest.mark.parametrize(
    ("environ", "fix"),
    [
        ({"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "trainer-node-0-0.trainer"}, "Kubernetes:"),
        # Our JobSet overlays set plain MASTER_ADDR; the kubelet's KUBERNETES_SERVICE_HOST says it is a pod.
        ({"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "mlm-node-0-0.mlm", "KUBERNETES_SERVICE_HOST": "10.0.0.1"},
         "Kubernetes:"),
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "2", "SLURM_NODEID": "1",
          "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "gpu[07-08]"}, "Slurm's name for node 0"),
    ],
)  # fmt: skip
def test_an_unresolvable_master_gets_the_launchers_hint_for_where_its_name_came_from(environ, fix):
    found = network.check_master(environ)
    assert found.status == "FAIL" and found.fix.startswith(fix)
    with pytest.raises(UserError) as caught:  # what the launcher says when it gives up waiting for the same name
        wait_for_address(
            found.data["host"], found.data["source"], 0, lambda m: None, Lookup(unresolvable, lambda s: None), environ
        )
    assert found.fix in str(caught.value)


def unresolvable(host: str) -> None:
    raise OSError("Name or service not known")


def test_master_node_checks_its_port_is_free():
    free = {"NNODES": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(closed_port()), "NODE_RANK": "0"}
    found = network.check_master(free)
    assert found.status == "OK" and "hosts the rendezvous" in found.detail
    with socket.socket() as server:
        server.bind(("", 0))
        server.listen()
        busy = {**free, "MASTER_PORT": str(server.getsockname()[1])}
        assert network.check_master(busy).status == "WARN"
    assert network.check_master({}).status == "SKIP"


def test_an_indexed_job_pod_is_a_worker_by_its_completion_index():
    environ = {"NNODES": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(closed_port())}
    assert "hosts the rendezvous" in network.check_master({**environ, "JOB_COMPLETION_INDEX": "0"}).detail
    assert network.check_master({**environ, "JOB_COMPLETION_INDEX": "1"}).status == "FAIL"


def test_dynamic_rendezvous_endpoint_is_checked():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        environ = {"PET_NNODES": "1:4", "PET_RDZV_ENDPOINT": f"127.0.0.1:{server.getsockname()[1]}"}
        found = network.check_master(environ)
        assert found.status == "OK" and "PET_RDZV_ENDPOINT=127.0.0.1" in found.detail
        assert found.data["mode"] == "dynamic"


def test_a_topology_error_is_a_fail_with_its_message():
    found = network.check_master({"NODE_RANK": "1"})
    assert found.status == "FAIL" and "NNODES" in found.detail
