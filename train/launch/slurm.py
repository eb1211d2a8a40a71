"""Slurm: the job step this process is a task of, and Slurm's host-list grammar (node 0 is the first host).

Slurm's variables count only inside a job step, what ``srun`` starts (SLURM_JOB_ID and SLURM_STEP_ID set), with one
task per node (``srun --ntasks-per-node=1``: the launcher starts a rank per GPU itself). The step's own variables are
read, not the job's: ``srun --nodes=1`` inside a 2-node job is a one-node run whose node 0 is the step's first node
(SLURM_JOB_NUM_NODES and SLURM_JOB_NODELIST would name the job's 2). The port follows enroot's PyTorch hook
(``conf/hooks/extra/50-slurm-pytorch.sh``): two jobs sharing node 0 get different ports, above Linux's ephemeral
range. A multi-node job's batch script, outside any step, is refused: it runs on node 0 only, and training there
alone would leave the other nodes idle.

topology.py decides when these facts are used (explicit PET_* and torch variables win over each of them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from train.common.errors import ConfigError
from train.config import shown
from train.launch.variables import first_set, integer

# 61000 + SLURM_JOB_ID % 4536 (enroot's PyTorch hook), so the port ends at 65535.
SLURM_PORT_BASE, SLURM_PORT_SPAN = 61000, 4536
MAX_HOSTS = 65536  # Slurm's own limit on one range (hostlist.c MAX_RANGE); more is a typo, not a cluster
SRUN_HINT = "srun --ntasks-per-node=1 entrypoint.sh (see slurm/)"


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


def slurm_step(environ: Mapping[str, str]) -> SlurmStep | None:
    """The Slurm job step this process is a task of, or None outside one (no SLURM_JOB_ID or SLURM_STEP_ID)."""
    job_id, _ = first_set(environ, "SLURM_JOB_ID")
    step_id, _ = first_set(environ, "SLURM_STEP_ID")
    if job_id is None or step_id is None:
        return None
    if not job_id.isdecimal() or not job_id.isascii():
        raise ConfigError(f"SLURM_JOB_ID={shown(job_id)}: expected a Slurm job id (an integer)")
    raw, nnodes_source = first_set(environ, "SLURM_STEP_NUM_NODES", "SLURM_NNODES")
    if raw is None or nnodes_source is None:
        raise ConfigError(f"SLURM_STEP_ID={step_id} but neither SLURM_STEP_NUM_NODES nor SLURM_NNODES is set")
    nnodes = integer(raw, nnodes_source, 1)
    raw, _ = first_set(environ, "SLURM_NODEID")
    node_id = integer(raw, "SLURM_NODEID") if raw is not None else 0
    raw, tasks_source = first_set(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    tasks = integer(raw, tasks_source, 1) if raw is not None and tasks_source is not None else None
    nodelist, nodelist_source = first_set(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if nodelist is None or nodelist_source is None:
        nodelist, nodelist_source = "", "SLURM_STEP_NODELIST"
    return SlurmStep(job_id, nnodes, nnodes_source, node_id, nodelist, nodelist_source, tasks, tasks_source or "")


def refuse_batch_script(environ: Mapping[str, str]) -> None:
    """A multi-node job's batch script runs on its first node only: training there would leave the others idle.

    Called only when no node count is set explicitly (NNODES=1 is the way out the error names)."""
    if first_set(environ, "SLURM_JOB_ID")[0] is None or first_set(environ, "SLURM_STEP_ID")[0] is not None:
        return
    raw, source = first_set(environ, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    if raw is not None and raw.isdecimal() and int(raw) > 1:
        raise ConfigError(
            f"{source}={raw} but this is the job's batch script, not a job step: start one launcher per node with "
            f"{SRUN_HINT}, or set NNODES=1 to train on this node alone"
        )
