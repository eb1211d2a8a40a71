"""Where this node sits in the job, read from the cluster's environment (Kubeflow PyTorchJob and TrainJob,
an Indexed Job, torchrun's own variables, a person), and the wait for the rendezvous address to resolve.

Each variable preferred over the next:

    nnodes          PET_NNODES (N, or min:max for elastic)  > NNODES  > 1
    node rank       PET_NODE_RANK  > NODE_RANK  > JOB_COMPLETION_INDEX (Indexed Job, multi-node only)  > 0
    master          PET_MASTER_ADDR/PET_MASTER_PORT  > MASTER_ADDR/MASTER_PORT  (port default 29500)
    rendezvous      PET_RDZV_ENDPOINT, PET_RDZV_BACKEND (default c10d), PET_RDZV_ID, PET_RDZV_CONF
    nproc_per_node  PET_NPROC_PER_NODE (below MLM_NPROC_PER_NODE, see decide.decide_nproc)
    max_restarts    PET_MAX_RESTARTS (below MLM_MAX_RESTARTS)
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from train.errors import EXIT_CRASH, ConfigError, UserError
from train.validate import MAX_RESTARTS, shown

DEFAULT_MASTER_PORT = 29500
MAX_PORT = 65535
DEFAULT_RDZV_ID = "mlm-trainer"


@dataclass(frozen=True)
class Topology:
    """Where this node sits in the job, from the cluster environment."""

    min_nodes: int = 1
    max_nodes: int = 1
    node_rank: int = 0
    mode: str = "standalone"  # standalone (one node) | static (fixed nodes, node 0 hosts the store) | dynamic
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
    def hosts_rendezvous(self) -> bool:
        """This node's torchrun listens for the others (node 0 of a static rendezvous)."""
        return self.mode == "static" and self.node_rank == 0

    @property
    def rendezvous_address(self) -> tuple[str, int] | None:
        """(host, port) the nodes meet at; None on one node."""
        if self.mode == "standalone":
            return None
        if self.rdzv_endpoint:
            host, port = split_endpoint(self.rdzv_endpoint)
            return host, port or self.master_port
        return (self.master_addr, self.master_port) if self.master_addr else None

    @property
    def address_to_wait_for(self) -> tuple[str, str] | None:
        """(host, source) this node must resolve before torchrun can meet the others."""
        if self.mode == "standalone" or (self.mode == "static" and self.node_rank == 0):
            return None  # node 0 of a static rendezvous hosts the store: it only listens
        if self.rdzv_endpoint:
            return split_endpoint(self.rdzv_endpoint)[0], self.sources.get("rdzv_endpoint", "PET_RDZV_ENDPOINT")
        if self.master_addr:
            return self.master_addr, self.sources.get("master_addr", "MASTER_ADDR")
        return None


def _first(environ: Mapping[str, str], *names: str) -> tuple[str, str] | tuple[None, None]:
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return value, name
    return None, None


def _int(value: str, source: str, minimum: int = 0, maximum: int | None = None) -> int:
    expected = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{source}={shown(value)}: expected {expected}") from None
    if number < minimum or (maximum is not None and number > maximum):
        raise ConfigError(f"{source}={shown(value)}: expected {expected}")
    return number


def split_endpoint(endpoint: str) -> tuple[str, int | None]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        return endpoint.strip("[]"), None
    return host.strip("[]"), int(port)


def _parse_conf(text: str | None) -> dict[str, str]:
    conf = {}
    for item in (text or "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            conf[key.strip()] = value.strip()
    return conf


def topology_from_env(environ: Mapping[str, str]) -> Topology:
    """Read the node topology a PyTorchJob, TrainJob, Indexed Job or a person gave this node."""
    sources: dict[str, str] = {}

    raw, source = _first(environ, "PET_NNODES", "NNODES")
    min_nodes = max_nodes = 1
    if raw is not None:
        sources["nnodes"] = source
        low, sep, high = raw.partition(":")
        min_nodes = _int(low, source, 1)
        max_nodes = _int(high, source, 1) if sep else min_nodes
        if max_nodes < min_nodes:
            raise ConfigError(f"{source}={raw!r}: expected N or min:max with min <= max")

    raw, source = _first(environ, "PET_NODE_RANK", "NODE_RANK")
    if raw is None and max_nodes > 1:
        # A Kubernetes Indexed Job numbers its pods 0..completions-1: that is the node rank.
        raw, source = _first(environ, "JOB_COMPLETION_INDEX")
    node_rank = 0
    if raw is not None:
        node_rank = _int(raw, source)
        sources["node_rank"] = source

    master_addr, source = _first(environ, "PET_MASTER_ADDR", "MASTER_ADDR")
    if source:
        sources["master_addr"] = source
    raw, source = _first(environ, "PET_MASTER_PORT", "MASTER_PORT")
    master_port = DEFAULT_MASTER_PORT
    if raw is not None:
        master_port = _int(raw, source, 1, MAX_PORT)
        sources["master_port"] = source

    endpoint, source = _first(environ, "PET_RDZV_ENDPOINT")
    if source:
        sources["rdzv_endpoint"] = source
        port = split_endpoint(endpoint)[1]
        if port is not None and not 1 <= port <= MAX_PORT:
            raise ConfigError(f"{source}={shown(endpoint)}: expected host:port with a port from 1 to {MAX_PORT}")
    backend, _ = _first(environ, "PET_RDZV_BACKEND")
    rdzv_id, _ = _first(environ, "PET_RDZV_ID")
    conf = _parse_conf(environ.get("PET_RDZV_CONF"))

    raw, source = _first(environ, "PET_MAX_RESTARTS")
    max_restarts = _int(raw, source, 0, MAX_RESTARTS) if raw is not None else None
    nproc, _ = _first(environ, "PET_NPROC_PER_NODE")

    if endpoint or (max_nodes > 1 and min_nodes != max_nodes):
        mode = "static" if backend == "static" else "dynamic"
        if not endpoint:
            if not master_addr:
                raise ConfigError(
                    f"an elastic node range {min_nodes}:{max_nodes} needs PET_RDZV_ENDPOINT or PET_MASTER_ADDR/"
                    "MASTER_ADDR: the address every node meets at"
                )
            endpoint = f"{master_addr}:{master_port}"
            sources["rdzv_endpoint"] = sources["master_addr"]
    elif max_nodes > 1:
        mode = "static"
        if not master_addr:
            raise ConfigError(
                f"{sources['nnodes']}={max_nodes} needs the address of node 0: set PET_MASTER_ADDR or MASTER_ADDR"
            )
    else:
        mode = "standalone"
        if node_rank > 0:
            # Node 1 of a job that forgot its size would otherwise train alone, unnoticed.
            raise ConfigError(
                f"{sources['node_rank']}={node_rank} but the job has one node: "
                "set PET_NNODES or NNODES to the node count"
            )
    if mode == "static" and node_rank >= max_nodes:
        raise ConfigError(
            f"{sources.get('node_rank', 'node rank')}={node_rank}: expected 0..{max_nodes - 1} "
            f"for {sources['nnodes']}={max_nodes}"
        )
    if mode == "dynamic":
        backend = backend or "c10d"
        rdzv_id = rdzv_id or DEFAULT_RDZV_ID
    return Topology(
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        node_rank=node_rank if mode != "standalone" else 0,
        mode=mode,
        master_addr=master_addr,
        master_port=master_port,
        rdzv_backend=backend,
        rdzv_endpoint=endpoint if mode != "standalone" else None,
        rdzv_id=rdzv_id,
        rdzv_conf=conf,
        max_restarts=max_restarts,
        nproc_per_node=nproc,
        sources=sources,
    )


def wait_for_address(
    host: str,
    source: str,
    timeout_s: float,
    log: Callable[[str], None],
    resolve: Callable[[str], object] = lambda host: socket.getaddrinfo(host, None),
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Wait until ``host`` resolves: a Kubernetes Service name appears some seconds after the pods start.

    Returns the number of failed attempts; raises a UserError with exit code 1 when ``timeout_s`` passes: not 3,
    because a master pod still Pending (no GPU free yet) is worth retrying, and the podFailurePolicy fails the Job
    at once on 3.
    """
    deadline = clock() + timeout_s
    delay, failures = 1.0, 0
    while True:
        try:
            resolve(host)
            if failures:
                log(f"{source}={host} resolves now (after {failures} failed attempts)")
            return failures
        except OSError as exc:
            failures += 1
            left = deadline - clock()
            if left <= 0:
                raise UserError(
                    f"{source}={host!r} did not resolve within {timeout_s:.0f}s ({exc}); check that the master "
                    "pod and its headless Service exist (or raise MLM_RDZV_TIMEOUT)",
                    exit_code=EXIT_CRASH,
                ) from None
            log(f"waiting for {source}={host} to resolve (attempt {failures}, {left:.0f}s left): {exc}")
            sleep(min(delay, left))
            delay = min(delay * 2, 10.0)
