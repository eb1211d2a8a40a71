"""The network rows: an NCCL all-reduce across this node's GPUs (doctor's own, in spawned processes), and the
multi-node rendezvous as ``train.launch.topology`` reads it from the cluster environment: on the node that hosts
it the port must be free, elsewhere the address must resolve and answer."""

from __future__ import annotations

import json
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from train.common.errors import UserError
from train.doctor.machine import TorchView
from train.doctor.rows import FAIL, OK, SKIP, WARN, Check
from train.launch.plan import Plan
from train.launch.rendezvous import resolve_hint
from train.launch.topology import Topology, topology_from_env

MIB = 1024**2
NCCL_TIMEOUT_S = 120.0
LOW_BUSBW_GBPS = 10.0  # below this, all-reduce traffic is likely going through the host (no P2P / NVLink)
CONNECT_TIMEOUT_S = 3.0


# ---- NCCL all-reduce -----------------------------------------------------------------------------------------------


def _allreduce_worker(rank: int, world: int, port: int, size_mib: int, iters: int, result_path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=device
    )
    try:
        # Correctness first: each rank contributes rank+1, the sum is known.
        probe = torch.full((1024,), float(rank + 1), device=device)
        dist.all_reduce(probe)
        expected = world * (world + 1) / 2
        if not torch.allclose(probe, torch.full_like(probe, expected)):
            raise RuntimeError(f"all-reduce returned {probe[0].item()} instead of {expected}")
        data = torch.ones(size_mib * MIB // 4, device=device, dtype=torch.float32)
        for _ in range(3):  # warm-up: NCCL sets up its channels on the first calls
            dist.all_reduce(data)
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(data)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / iters
        if rank == 0:
            Path(result_path).write_text(json.dumps({"seconds": seconds}), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def nccl_allreduce(
    world: int, size_mib: int = 256, iters: int = 20, timeout: float = NCCL_TIMEOUT_S
) -> dict[str, float]:
    """All-reduce ``size_mib`` across ``world`` local GPUs, one process each; bus bandwidth as nccl-tests defines it.

    Raises RuntimeError (with the failing rank's error) or TimeoutError.
    """
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="mlm-doctor-") as tmp:
        result = Path(tmp) / "result.json"
        context = mp.start_processes(
            _allreduce_worker,
            args=(world, _free_port(), size_mib, iters, str(result)),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no result within {timeout:.0f} s (a hang: NCCL cannot connect the GPUs)")
        except mp.ProcessRaisedException as exc:
            last = [line for line in str(exc).strip().splitlines() if line.strip()]
            raise RuntimeError(last[-1] if last else "a rank failed") from None
        except mp.ProcessExitedException as exc:
            raise RuntimeError(str(exc)) from None
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
        seconds = json.loads(result.read_text(encoding="utf-8"))["seconds"]
    algbw = size_mib * MIB / seconds / 1e9
    return {"seconds": seconds, "algbw_gbps": algbw, "busbw_gbps": algbw * 2 * (world - 1) / world}


def check_nccl(
    torch: TorchView, plan: Plan | None = None, run: Callable[[int], dict[str, float]] | None = None
) -> Check:
    """An all-reduce across the GPUs the plan's ranks use (all torch sees when there is no plan)."""
    if plan is not None and plan.backend != "nccl":
        return Check("nccl", SKIP, f"the plan uses the {plan.backend} backend")
    world = torch.count if plan is None else min(torch.count, plan.nproc_per_node)
    if world < 2:
        return Check("nccl", SKIP, "fewer than 2 GPUs")
    fix = (
        "rerun with NCCL_DEBUG=INFO to see why; give the container IPC room (--ipc=host or a large /dev/shm); "
        "inside VMs try NCCL_P2P_DISABLE=1"
    )
    try:
        result = (run or nccl_allreduce)(world)
    except (RuntimeError, TimeoutError, OSError) as exc:
        return Check("nccl", FAIL, f"all-reduce across {world} GPUs failed: {exc}", fix)
    detail = f"all-reduce across {world} GPUs: bus bandwidth {result['busbw_gbps']:.1f} GB/s"
    if result["busbw_gbps"] < LOW_BUSBW_GBPS:
        return Check(
            "nccl",
            WARN,
            detail + " (low: no peer-to-peer path between the GPUs?)",
            "nvidia-smi topo -m shows the links; NCCL_DEBUG=INFO shows the transport NCCL picked",
        )
    return Check("nccl", OK, detail)


# ---- multi-node ----------------------------------------------------------------------------------------------------


def check_master(environ: Mapping[str, str]) -> Check:
    try:
        topology = topology_from_env(environ)
    except UserError as exc:
        return Check("master", FAIL, str(exc), "fix the cluster variables (PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR)")
    address = topology.rendezvous_address
    if topology.is_standalone or address is None:
        return Check("master", SKIP, "single node (no PET_NNODES / NNODES above 1, no PET_RDZV_ENDPOINT)")
    port = address[1]
    data = {"host": address[0], "port": port, "mode": topology.mode, "node_rank": topology.node_rank}
    wait = topology.address_to_wait_for
    if topology.hosts_rendezvous or wait is None:
        return _check_port_free(topology, address[0], port, data)
    host, source = wait
    data["host"], data["source"] = host, source
    named = f"{source}={host}, port {port}"
    try:
        resolved = str(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0])
    except socket.gaierror as exc:
        return Check("master", FAIL, f"{named}: does not resolve ({exc.strerror})", resolve_hint(source, environ), data)
    try:
        with socket.create_connection((resolved, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except TimeoutError:
        return Check(
            "master",
            FAIL,
            f"{named} ({resolved}): no answer in {CONNECT_TIMEOUT_S:.0f} s",
            "a firewall or NetworkPolicy drops the traffic; allow the port between the nodes",
            data,
        )
    except OSError as exc:
        start = (
            "start the master node (node rank 0) first: its torchrun listens there"
            if topology.is_static
            else "start the node that hosts the rendezvous first"
        )
        return Check(
            "master",
            FAIL,
            f"{named} ({resolved}): {exc.strerror or exc}",
            f"{start}; check {topology.sources.get('master_port', 'MASTER_PORT')}",
            data,
        )
    return Check("master", OK, f"{named} ({resolved}) answers", data=data)


def _check_port_free(topology: Topology, host: str, port: int, data: dict) -> Check:
    """Node 0 of a static rendezvous: its torchrun listens on the port, which must be free."""
    source = topology.sources.get("rdzv_endpoint" if topology.rdzv_endpoint else "master_addr", "the address")
    data["source"] = source
    where = f"{source}={host}: this node (node rank 0) hosts the rendezvous"
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as exc:
            return Check(
                "master",
                WARN,
                f"{where} but port {port} is taken ({exc.strerror})",
                "stop what holds it or choose another PET_MASTER_PORT / MASTER_PORT",
                data,
            )
    return Check("master", OK, f"{where}; port {port} is free", data=data)
