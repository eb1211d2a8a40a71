"""Where this node sits in the job, read from the cluster's environment (Kubeflow PyTorchJob and TrainJob, an
Indexed Job, a Slurm job step, torchrun's own variables, a person).

Each variable preferred over the next:

    nnodes          PET_NNODES (N, or min:max for elastic)  > NNODES  > SLURM_STEP_NUM_NODES, SLURM_NNODES (Slurm)  > 1
    node rank       PET_NODE_RANK  > NODE_RANK  > SLURM_NODEID (Slurm)
                    > JOB_COMPLETION_INDEX (Indexed Job, multi-node only)  > 0
    master          PET_MASTER_ADDR  > MASTER_ADDR  > the first host of SLURM_STEP_NODELIST (Slurm)
    master port     PET_MASTER_PORT  > MASTER_PORT  > 61000 + SLURM_JOB_ID % 4536 (Slurm)  > 29500
    rendezvous      PET_RDZV_ENDPOINT, PET_RDZV_BACKEND (default c10d), PET_RDZV_ID (> SLURM_JOB_ID), PET_RDZV_CONF
    nproc_per_node  PET_NPROC_PER_NODE (below MLM_NPROC_PER_NODE, see decide.decide_nproc); on Slurm the GPUs of the
                    step, which Slurm names in CUDA_VISIBLE_DEVICES (gpus.py applies it)
    max_restarts    PET_MAX_RESTARTS (below MLM_MAX_RESTARTS)

Slurm's facts (slurm.py: which variables count, inside a job step only) fill in what nothing explicit sets; the wait
for the master's name to resolve is rendezvous.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from train.common.errors import ConfigError
from train.config import MAX_RESTARTS, shown
from train.launch.slurm import SlurmStep, refuse_batch_script, slurm_step
from train.launch.variables import first_set, integer

DEFAULT_MASTER_PORT = 29500
MAX_PORT = 65535
DEFAULT_RDZV_ID = "mlm-trainer"

# How the nodes meet, as torchrun is told:
#   standalone  one node: --standalone, nothing to meet
#   static      node 0's torchrun hosts the store the others connect to: several nodes, a fixed count and no
#               endpoint (--master-addr/--master-port), or whatever PET_RDZV_BACKEND=static is given
#   dynamic     a rendezvous backend (c10d unless PET_RDZV_BACKEND says) at an endpoint: PET_RDZV_ENDPOINT, or the
#               master's address for an elastic node range
Mode = Literal["standalone", "static", "dynamic"]


@dataclass(frozen=True)
class Topology:
    """Where this node sits in the job, from the cluster environment."""

    min_nodes: int = 1
    max_nodes: int = 1
    node_rank: int = 0
    mode: Mode = "standalone"
    master_addr: str | None = None
    master_port: int = DEFAULT_MASTER_PORT
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    rdzv_conf: dict[str, str] = field(default_factory=dict)
    max_restarts: int | None = None  # PET_MAX_RESTARTS
    nproc_per_node: str | None = None  # PET_NPROC_PER_NODE
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def nnodes(self) -> str:
        """As torchrun takes it: N, or min:max when elastic."""
        return str(self.max_nodes) if self.min_nodes == self.max_nodes else f"{self.min_nodes}:{self.max_nodes}"

    @property
    def elastic(self) -> bool:
        return self.min_nodes != self.max_nodes

    @property
    def is_standalone(self) -> bool:
        """One node: nothing to meet."""
        return self.mode == "standalone"

    @property
    def is_static(self) -> bool:
        """Node 0's torchrun hosts the store the others connect to (torchrun's static rendezvous)."""
        return self.mode == "static"

    @property
    def is_dynamic(self) -> bool:
        """A rendezvous backend at an endpoint (c10d by default): a node range, or an endpoint given."""
        return self.mode == "dynamic"

    @property
    def hosts_rendezvous(self) -> bool:
        """This node's torchrun listens for the others (node 0 of a static rendezvous)."""
        return self.is_static and self.node_rank == 0

    @property
    def rendezvous_address(self) -> tuple[str, int] | None:
        """(host, port) the nodes meet at; None on one node."""
        if self.is_standalone:
            return None
        if self.rdzv_endpoint:
            host, port = split_endpoint(self.rdzv_endpoint)
            return host, port or self.master_port
        return (self.master_addr, self.master_port) if self.master_addr else None

    @property
    def address_to_wait_for(self) -> tuple[str, str] | None:
        """(host, source) this node must resolve before torchrun can meet the others."""
        if self.is_standalone or self.hosts_rendezvous:
            return None  # node 0 of a static rendezvous hosts the store: it only listens
        if self.rdzv_endpoint:
            return split_endpoint(self.rdzv_endpoint)[0], self.sources.get("rdzv_endpoint", "PET_RDZV_ENDPOINT")
        if self.master_addr:
            return self.master_addr, self.sources.get("master_addr", "MASTER_ADDR")
        return None


def split_endpoint(endpoint: str) -> tuple[str, int | None]:
    """``host:port`` (``[v6]:port``) as (host, port); the port None when the endpoint names none."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        return endpoint.strip("[]"), None
    return host.strip("[]"), int(port)


def topology_from_env(environ: Mapping[str, str]) -> Topology:
    """Read the node topology a PyTorchJob, TrainJob, Indexed Job, Slurm job step or a person gave this node.

    ``sources`` records, per fact, the variable it came from: errors, the plan document and doctor name it.
    """
    sources: dict[str, str] = {}
    step = slurm_step(environ)
    min_nodes, max_nodes = _node_range(environ, step, sources)
    node_rank = _node_rank(environ, step, max_nodes, sources)
    if step is not None and (sources.get("nnodes") == step.nnodes_source or sources.get("node_rank") == "SLURM_NODEID"):
        step.check_one_task_per_node()  # the step's numbers are in use: they hold only with one task per node
    slurm = step if step is not None and max_nodes > 1 else None  # its address, port and id matter across nodes only
    master_addr, master_port = _master(environ, slurm, sources)
    endpoint, rdzv_id = _endpoint_and_id(environ, slurm, sources)
    backend, _ = first_set(environ, "PET_RDZV_BACKEND")
    raw, source = first_set(environ, "PET_MAX_RESTARTS")
    max_restarts = integer(raw, source, 0, MAX_RESTARTS) if raw is not None and source is not None else None

    mode = _mode(min_nodes, max_nodes, endpoint, backend)
    if mode == "standalone" and node_rank > 0:
        # Node 1 of a job that forgot its size would otherwise train alone, unnoticed.
        raise ConfigError(
            f"{sources['node_rank']}={node_rank} but the job has one node: set PET_NNODES or NNODES to the node count"
        )
    if mode != "standalone" and not endpoint:
        endpoint = _meet_at_master(min_nodes, max_nodes, master_addr, master_port, sources)
    if mode == "static" and node_rank >= max_nodes:
        # No node count set with a static endpoint (PET_RDZV_BACKEND=static) is one node.
        nodes = f"{sources['nnodes']}={max_nodes}" if "nnodes" in sources else "one node (PET_NNODES, NNODES unset)"
        raise ConfigError(
            f"{sources.get('node_rank', 'node rank')}={node_rank}: expected 0..{max_nodes - 1} for {nodes}"
        )
    if mode == "dynamic":
        backend = backend or "c10d"
        rdzv_id = rdzv_id or DEFAULT_RDZV_ID
    return Topology(
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        node_rank=node_rank,  # 0 on one node: a higher one is refused above
        mode=mode,
        master_addr=master_addr,
        master_port=master_port,
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,  # None on one node: an endpoint makes the rendezvous dynamic or static
        rdzv_id=rdzv_id,
        rdzv_conf=_parse_conf(environ.get("PET_RDZV_CONF")),
        max_restarts=max_restarts,
        nproc_per_node=first_set(environ, "PET_NPROC_PER_NODE")[0],  # checked where it is used (decide_nproc)
        sources=sources,
    )


def _node_range(environ: Mapping[str, str], step: SlurmStep | None, sources: dict[str, str]) -> tuple[int, int]:
    """(min, max) nodes: PET_NNODES or NNODES (N or min:max), else the Slurm step's node count, else one node."""
    raw, source = first_set(environ, "PET_NNODES", "NNODES")
    if raw is None and step is not None:
        raw, source = str(step.nnodes), step.nnodes_source
    elif raw is None:
        refuse_batch_script(environ)  # no count given, no step: a multi-node job's batch script must not train
    if raw is None or source is None:
        return 1, 1
    sources["nnodes"] = source
    low, sep, high = raw.partition(":")
    min_nodes = integer(low, source, 1)
    max_nodes = integer(high, source, 1) if sep else min_nodes
    if max_nodes < min_nodes:
        raise ConfigError(f"{source}={shown(raw)}: expected N or min:max with min <= max")
    return min_nodes, max_nodes


def _node_rank(environ: Mapping[str, str], step: SlurmStep | None, max_nodes: int, sources: dict[str, str]) -> int:
    """PET_NODE_RANK or NODE_RANK, else the Slurm step's SLURM_NODEID, else (several nodes) an Indexed Job's
    completion index, else 0."""
    raw, source = first_set(environ, "PET_NODE_RANK", "NODE_RANK")
    if raw is None and step is not None:
        raw, source = str(step.node_id), "SLURM_NODEID"
    if raw is None and max_nodes > 1:
        # A Kubernetes Indexed Job numbers its pods 0..completions-1: that is the node rank.
        raw, source = first_set(environ, "JOB_COMPLETION_INDEX")
    if raw is None or source is None:
        return 0
    sources["node_rank"] = source
    return integer(raw, source)


def _master(environ: Mapping[str, str], slurm: SlurmStep | None, sources: dict[str, str]) -> tuple[str | None, int]:
    """Node 0's address and port: PET_MASTER_* or MASTER_*, else a multi-node Slurm step's first host and the port
    of its job id; the port is torchrun's 29500 otherwise."""
    master_addr, source = first_set(environ, "PET_MASTER_ADDR", "MASTER_ADDR")
    if source:
        sources["master_addr"] = source
    elif slurm is not None and not first_set(environ, "PET_RDZV_ENDPOINT")[0]:
        # With an endpoint the nodes meet there: Slurm's host list is not read (nor refused when malformed).
        master_addr = slurm.first_host()
        sources["master_addr"] = slurm.nodelist_source
    raw, source = first_set(environ, "PET_MASTER_PORT", "MASTER_PORT")
    if raw is not None and source is not None:
        sources["master_port"] = source
        return master_addr, integer(raw, source, 1, MAX_PORT)
    if slurm is not None:
        sources["master_port"] = "SLURM_JOB_ID"
        return master_addr, slurm.master_port
    return master_addr, DEFAULT_MASTER_PORT


def _endpoint_and_id(
    environ: Mapping[str, str], slurm: SlurmStep | None, sources: dict[str, str]
) -> tuple[str | None, str | None]:
    """PET_RDZV_ENDPOINT (its port, if any, checked), and the run's id: PET_RDZV_ID, else a multi-node Slurm step's
    job id (torchrun's logs name the run by it)."""
    endpoint, source = first_set(environ, "PET_RDZV_ENDPOINT")
    if endpoint is not None and source is not None:
        sources["rdzv_endpoint"] = source
        port = split_endpoint(endpoint)[1]
        if port is not None and not 1 <= port <= MAX_PORT:
            raise ConfigError(f"{source}={shown(endpoint)}: expected host:port with a port from 1 to {MAX_PORT}")
    rdzv_id, source = first_set(environ, "PET_RDZV_ID")
    if rdzv_id is None and slurm is not None:
        rdzv_id, source = slurm.job_id, "SLURM_JOB_ID"
    if source:
        sources["rdzv_id"] = source
    return endpoint, rdzv_id


def _mode(min_nodes: int, max_nodes: int, endpoint: str | None, backend: str | None) -> Mode:
    """An endpoint or an elastic range takes a rendezvous backend (static only when PET_RDZV_BACKEND says so); a
    fixed count of several nodes meets at node 0; one node meets nobody."""
    if endpoint or min_nodes != max_nodes:
        return "static" if backend == "static" else "dynamic"
    return "static" if max_nodes > 1 else "standalone"


def _meet_at_master(
    min_nodes: int, max_nodes: int, master_addr: str | None, master_port: int, sources: dict[str, str]
) -> str | None:
    """Without PET_RDZV_ENDPOINT the nodes meet at the master: an elastic range has it as its endpoint, a fixed
    count passes it to torchrun as --master-addr (no endpoint, None). Refused when no master is set."""
    if not master_addr:
        if min_nodes != max_nodes:
            raise ConfigError(
                f"an elastic node range {min_nodes}:{max_nodes} needs PET_RDZV_ENDPOINT or PET_MASTER_ADDR/"
                "MASTER_ADDR: the address every node meets at"
            )
        raise ConfigError(
            f"{sources['nnodes']}={max_nodes} needs the address of node 0: set PET_MASTER_ADDR or MASTER_ADDR"
        )
    if min_nodes == max_nodes:
        return None
    sources["rdzv_endpoint"] = sources["master_addr"]
    return f"{master_addr}:{master_port}"


def _parse_conf(text: str | None) -> dict[str, str]:
    """PET_RDZV_CONF's ``key=value,...`` pairs (an item without ``=`` or without a key is skipped)."""
    conf = {}
    for item in (text or "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            conf[key.strip()] = value.strip()
    return conf
