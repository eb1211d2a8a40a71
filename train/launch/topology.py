"""Where this node sits in the job, read from the cluster's environment (Kubeflow PyTorchJob and TrainJob,
an Indexed Job, a Slurm job step, torchrun's own variables, a person), and the wait for the rendezvous address to
resolve.

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

Slurm's variables count only inside a job step, what ``srun`` starts (SLURM_JOB_ID and SLURM_STEP_ID set), with one
task per node (``srun --ntasks-per-node=1``: the launcher starts a rank per GPU itself). The step's own variables are
read, not the job's: ``srun --nodes=1`` inside a 2-node job is a one-node run whose node 0 is the step's first node
(SLURM_JOB_NUM_NODES and SLURM_JOB_NODELIST would name the job's 2). The port follows enroot's PyTorch hook
(``conf/hooks/extra/50-slurm-pytorch.sh``): two jobs sharing node 0 get different ports, above Linux's ephemeral
range. A multi-node job's batch script, outside any step, is refused: it runs on node 0 only, and training there
alone would leave the other nodes idle.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from train.errors import EXIT_CRASH, ConfigError, UserError
from train.validate import MAX_RESTARTS, shown

DEFAULT_MASTER_PORT = 29500
MAX_PORT = 65535
DEFAULT_RDZV_ID = "mlm-trainer"
# Slurm: 61000 + SLURM_JOB_ID % 4536 (enroot's PyTorch hook), so the port ends at 65535.
SLURM_PORT_BASE, SLURM_PORT_SPAN = 61000, 4536
MAX_HOSTS = 65536  # Slurm's own limit on one range (hostlist.c MAX_RANGE); more is a typo, not a cluster


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


class HostlistError(ValueError):
    """A Slurm host list that ``scontrol show hostnames`` would reject."""


_HOSTLIST_SEPARATORS = " \t,"


def _hostlist_tokens(text: str) -> list[str]:
    """Split on commas and blanks outside brackets: ``a,b[1-2]`` is two tokens, ``b[1,3]`` one."""
    tokens, token, depth = [], "", 0
    for char in text:
        if char == "[":
            if depth:
                raise HostlistError("a '[' inside brackets")
            depth = 1
        elif char == "]":
            if not depth:
                raise HostlistError("a ']' without its '['")
            depth = 0
        if depth == 0 and char in _HOSTLIST_SEPARATORS:
            if token:
                tokens.append(token)
            token = ""
        else:
            token += char
    if depth:
        raise HostlistError("a '[' without its ']'")
    if token:
        tokens.append(token)
    return tokens


def _hostlist_numbers(ranges: str) -> list[str]:
    """``01-03,7`` as ``["01", "02", "03", "7"]``: each range keeps the width of its lower bound (``[1-010]`` is 1..10
    unpadded, ``[01-3]`` is 01..03), as Slurm's hostlist.c pads them."""
    numbers: list[str] = []
    for item in ranges.split(","):
        low, sep, high = item.partition("-")
        if not low.isdecimal() or not low.isascii() or (sep and not (high.isdecimal() and high.isascii())):
            raise HostlistError(f"{item!r} is not a number or a range low-high")
        first, last = int(low), int(high) if sep else int(low)
        if last < first:
            raise HostlistError(f"the range {item!r} runs backwards")
        if len(numbers) + last - first + 1 > MAX_HOSTS:
            raise HostlistError(f"more than {MAX_HOSTS} hosts")
        numbers += [str(n).zfill(len(low)) for n in range(first, last + 1)]
    return numbers


def expand_hostlist(text: str) -> list[str]:
    """Every host of a Slurm host list, in order, the way ``scontrol show hostnames`` expands it.

    ``node[01-04,07]`` is node01..node04, node07; ``a,b[1-2]`` is a, b1, b2; several bracket groups multiply, the
    first varying slowest (``rack[1-2]-gpu[1-2]``: rack1-gpu1, rack1-gpu2, rack2-gpu1, rack2-gpu2). Hosts are
    separated by commas or blanks; duplicates are kept. Like Slurm 22.05, text after the last ``]`` of a host is an
    error (``n[1-2]x``), and so is a list that names no host. Raises HostlistError saying what is wrong.
    """
    hosts: list[str] = []
    for token in _hostlist_tokens(text):
        parts = token.replace("]", "[").split("[")  # literal, ranges, literal, ranges, ..., literal
        if len(parts) > 1 and parts[-1]:
            raise HostlistError(f"{token!r}: text after the last ']'")
        expanded = [""]
        for index, part in enumerate(parts):
            if index % 2 == 0:
                expanded = [host + part for host in expanded]
                continue
            numbers = _hostlist_numbers(part)
            if len(expanded) * len(numbers) + len(hosts) > MAX_HOSTS:
                raise HostlistError(f"more than {MAX_HOSTS} hosts")
            expanded = [host + number for host in expanded for number in numbers]
        hosts += expanded
        if len(hosts) > MAX_HOSTS:
            raise HostlistError(f"more than {MAX_HOSTS} hosts")
    if not hosts:
        raise HostlistError("no host")
    return hosts


@dataclass(frozen=True)
class SlurmStep:
    """What Slurm tells each task of a job step (``srun``) about the step."""

    job_id: str
    nnodes: int
    nnodes_source: str
    node_id: int
    nodelist: str  # compressed, as Slurm sets it: node[01-04]
    nodelist_source: str
    tasks: int | None = None
    tasks_source: str = "SLURM_STEP_NUM_TASKS"

    def check_one_task_per_node(self) -> None:
        """More tasks than nodes would start a launcher per task, each claiming every GPU of its node with the
        node rank of its neighbours."""
        if self.tasks is not None and self.tasks > self.nnodes:
            raise ConfigError(
                f"{self.tasks_source}={self.tasks} tasks on {self.nnodes_source}={self.nnodes} node(s): start one "
                f"launcher per node ({SRUN_HINT}); it starts one rank per GPU itself"
            )

    @property
    def master_port(self) -> int:
        return SLURM_PORT_BASE + int(self.job_id) % SLURM_PORT_SPAN

    def first_host(self) -> str:
        """Node 0 of the step: Slurm numbers SLURM_NODEID in the order of its node list."""
        try:
            hosts = expand_hostlist(self.nodelist)
        except HostlistError as exc:
            raise ConfigError(f"{self.nodelist_source}={shown(self.nodelist)}: not a Slurm host list ({exc})") from None
        if len(hosts) != self.nnodes:
            raise ConfigError(
                f"{self.nodelist_source}={shown(self.nodelist)} names {len(hosts)} host(s) but "
                f"{self.nnodes_source}={self.nnodes}: the Slurm variables disagree (set by hand, or from another step?)"
            )
        return hosts[0]


SRUN_HINT = "srun --ntasks-per-node=1 entrypoint.sh (see slurm/)"


def slurm_step(environ: Mapping[str, str]) -> SlurmStep | None:
    """The Slurm job step this process is a task of, or None outside one (no SLURM_JOB_ID or SLURM_STEP_ID)."""
    job_id, _ = _first(environ, "SLURM_JOB_ID")
    step_id, _ = _first(environ, "SLURM_STEP_ID")
    if job_id is None or step_id is None:
        return None
    if not job_id.isdecimal() or not job_id.isascii():
        raise ConfigError(f"SLURM_JOB_ID={shown(job_id)}: expected a Slurm job id (an integer)")
    raw, nnodes_source = _first(environ, "SLURM_STEP_NUM_NODES", "SLURM_NNODES")
    if raw is None or nnodes_source is None:
        raise ConfigError(f"SLURM_STEP_ID={step_id} but neither SLURM_STEP_NUM_NODES nor SLURM_NNODES is set")
    nnodes = _int(raw, nnodes_source, 1)
    raw, _ = _first(environ, "SLURM_NODEID")
    node_id = _int(raw, "SLURM_NODEID") if raw is not None else 0
    raw, tasks_source = _first(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    tasks = _int(raw, tasks_source, 1) if raw is not None and tasks_source is not None else None
    nodelist, nodelist_source = _first(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if nodelist is None or nodelist_source is None:
        nodelist, nodelist_source = "", "SLURM_STEP_NODELIST"
    return SlurmStep(job_id, nnodes, nnodes_source, node_id, nodelist, nodelist_source, tasks, tasks_source or "")


def _refuse_slurm_batch_script(environ: Mapping[str, str]) -> None:
    """A multi-node job's batch script runs on its first node only: training there would leave the others idle."""
    if _first(environ, "SLURM_JOB_ID")[0] is None or _first(environ, "SLURM_STEP_ID")[0] is not None:
        return
    raw, source = _first(environ, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    if raw is not None and raw.isdecimal() and int(raw) > 1:
        raise ConfigError(
            f"{source}={raw} but this is the job's batch script, not a job step: start one launcher per node with "
            f"{SRUN_HINT}, or set NNODES=1 to train on this node alone"
        )


def topology_from_env(environ: Mapping[str, str]) -> Topology:
    """Read the node topology a PyTorchJob, TrainJob, Indexed Job, Slurm job step or a person gave this node."""
    sources: dict[str, str] = {}
    step = slurm_step(environ)

    raw, source = _first(environ, "PET_NNODES", "NNODES")
    if raw is None and step is not None:
        raw, source = str(step.nnodes), step.nnodes_source
    elif raw is None:
        _refuse_slurm_batch_script(environ)
    min_nodes = max_nodes = 1
    if raw is not None:
        sources["nnodes"] = source
        low, sep, high = raw.partition(":")
        min_nodes = _int(low, source, 1)
        max_nodes = _int(high, source, 1) if sep else min_nodes
        if max_nodes < min_nodes:
            raise ConfigError(f"{source}={raw!r}: expected N or min:max with min <= max")

    raw, source = _first(environ, "PET_NODE_RANK", "NODE_RANK")
    if raw is None and step is not None:
        raw, source = str(step.node_id), "SLURM_NODEID"
    if raw is None and max_nodes > 1:
        # A Kubernetes Indexed Job numbers its pods 0..completions-1: that is the node rank.
        raw, source = _first(environ, "JOB_COMPLETION_INDEX")
    node_rank = 0
    if raw is not None:
        node_rank = _int(raw, source)
        sources["node_rank"] = source
    if step is not None and (sources.get("nnodes") == step.nnodes_source or sources.get("node_rank") == "SLURM_NODEID"):
        step.check_one_task_per_node()
    slurm = step if step is not None and max_nodes > 1 else None  # its address, port and id matter

    master_addr, source = _first(environ, "PET_MASTER_ADDR", "MASTER_ADDR")
    if source:
        sources["master_addr"] = source
    elif slurm is not None and not _first(environ, "PET_RDZV_ENDPOINT")[0]:
        master_addr = slurm.first_host()
        sources["master_addr"] = slurm.nodelist_source
    raw, source = _first(environ, "PET_MASTER_PORT", "MASTER_PORT")
    master_port = DEFAULT_MASTER_PORT
    if raw is not None:
        master_port = _int(raw, source, 1, MAX_PORT)
        sources["master_port"] = source
    elif slurm is not None:
        master_port = slurm.master_port
        sources["master_port"] = "SLURM_JOB_ID"

    endpoint, source = _first(environ, "PET_RDZV_ENDPOINT")
    if source:
        sources["rdzv_endpoint"] = source
        port = split_endpoint(endpoint)[1]
        if port is not None and not 1 <= port <= MAX_PORT:
            raise ConfigError(f"{source}={shown(endpoint)}: expected host:port with a port from 1 to {MAX_PORT}")
    backend, _ = _first(environ, "PET_RDZV_BACKEND")
    rdzv_id, source = _first(environ, "PET_RDZV_ID")
    if rdzv_id is None and slurm is not None:
        rdzv_id, source = slurm.job_id, "SLURM_JOB_ID"
    if source:
        sources["rdzv_id"] = source
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


def resolve_hint(source: str, environ: Mapping[str, str]) -> str:
    """What to check when node 0's name, read from ``source``, does not resolve (the launcher's wait and doctor's
    master check): Slurm's node names; in a Kubernetes pod (the kubelet sets KUBERNETES_SERVICE_HOST in every one,
    and our JobSet overlays set plain MASTER_ADDR) the Service; else the address a user set."""
    if source.startswith("SLURM_"):
        return (
            "Slurm's name for node 0 must resolve on every node; where NodeName is not the host's DNS name, set "
            "MASTER_ADDR to node 0's address"
        )
    if source.startswith("PET_") or environ.get("KUBERNETES_SERVICE_HOST"):
        return "Kubernetes: check that pod 0 of the job and its headless Service exist (the Service gives its name)"
    return f"set {source} to node 0's host name or IP address as this node reaches it"


def wait_for_address(
    host: str,
    source: str,
    timeout_s: float,
    log: Callable[[str], None],
    resolve: Callable[[str], object] = lambda host: socket.getaddrinfo(host, None),
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    environ: Mapping[str, str] = os.environ,
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
                hint = resolve_hint(source, environ)
                raise UserError(
                    f"{source}={host!r} did not resolve within {timeout_s:.0f}s ({exc}); {hint} "
                    "(or raise MLM_RDZV_TIMEOUT)",
                    exit_code=EXIT_CRASH,
                ) from None
            log(f"waiting for {source}={host} to resolve (attempt {failures}, {left:.0f}s left): {exc}")
            sleep(min(delay, left))
            delay = min(delay * 2, 10.0)
