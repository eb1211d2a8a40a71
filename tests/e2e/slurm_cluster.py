"""A real Slurm cluster on this machine for the tests: munged, slurmctld and two slurmd "nodes" (Debian's slurm-wlm).

Both slurmd run here, each under its own node name (``slurmd -N``) and port, with one CPU each. Slurm's node names
must resolve on every node (the launcher meets at the first one), so the daemons run in a private mount namespace
whose /etc/hosts adds ``mlmnode1``/``mlmnode2`` as 127.0.0.1; the jobs they start inherit it, the machine's own
/etc/hosts is untouched. The clients (sbatch, scontrol, scancel) run outside it and reach slurmctld on 127.0.0.1.

Everything lives under one directory (configuration, munge key and socket, state, spool, logs). :func:`slurm_cluster`
skips the test, with the reason, only where the packages are missing and cannot be installed (``bash
.ci/system-deps.sh``), where this is not root, or where the namespace or the daemons cannot be started. On the way out
it cancels every job and ends every process in the namespace: only ones it started.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("slurm-wlm", "munge")  # as .ci/system-deps.sh installs them
DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd")
CLIENTS = ("sbatch", "scontrol", "scancel", "squeue", "sinfo")
START_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Job:
    """One line of ``scontrol show job -o``, as key=value pairs."""

    fields: dict[str, str]

    @property
    def state(self) -> str:
        return self.fields.get("JobState", "")

    @property
    def restarts(self) -> int:
        return int(self.fields.get("Restarts", "0"))

    @property
    def exit_code(self) -> str:
        return self.fields.get("ExitCode", "")


@dataclass
class Cluster:
    root: Path
    conf: Path
    nodes: list[str]
    supervisor: subprocess.Popen

    @property
    def env(self) -> dict[str, str]:
        """The clients' environment: this cluster's configuration, no variables of an outer Slurm job."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def client(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False)

    def sbatch(self, *argv: str, env: Mapping[str, str]) -> str:
        """``sbatch argv`` from the checkout with the job environment ``env`` (plus this cluster's SLURM_CONF); the
        job id."""
        job_env = {k: v for k, v in env.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
        job_env["SLURM_CONF"] = str(self.conf)
        done = subprocess.run(
            ["sbatch", "--parsable", *argv], env=job_env, cwd=REPO, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, f"sbatch: {done.stderr}"
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> Job:
        done = self.client("scontrol", "show", "job", "-o", job_id)
        assert done.returncode == 0, f"scontrol show job {job_id}: {done.stderr}"
        return Job(dict(re.findall(r"(\w+)=(\S*)", done.stdout)))

    def wait(self, job_id: str, until: Callable[[Job], bool], what: str, timeout: float) -> Job:
        """Poll the job until ``until(job)`` holds; fail, with the job and the logs, after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if until(job):
                return job
            if time.monotonic() > deadline:
                pytest.fail(f"job {job_id} not {what} within {timeout:.0f} s: {job.fields}\n{self.logs()}")
            time.sleep(0.5)

    def logs(self) -> str:
        parts = []
        for log in sorted((self.root / "log").glob("*.log")):
            parts.append(f"--- {log.name} (end)\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(parts)

    def processes(self) -> list[int]:
        """Every process in the cluster's mount namespace: the daemons, slurmstepd and the jobs, all started here."""
        try:
            namespace = os.readlink(f"/proc/{self.supervisor.pid}/ns/mnt")
        except OSError:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != self.supervisor.pid:
                try:
                    if os.readlink(entry / "ns" / "mnt") == namespace:
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found

    def stop(self) -> None:
        self.client("scancel", "--full", "--user", "root", timeout=30)
        pids = self.processes()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 10
            while (pids := self.processes()) and time.monotonic() < deadline:
                time.sleep(0.2)
            if not pids:
                break
        self.supervisor.kill()
        self.supervisor.wait(timeout=30)


def _missing() -> list[str]:
    return [name for name in (*DAEMONS, *CLIENTS, "unshare", "mount") if shutil.which(name, path=_PATH) is None]


_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def _install() -> str | None:
    """Install the packages .ci/system-deps.sh lists for this test; why not, or None."""
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=600"]
    for argv in ([*apt, "update", "-qq"], [*apt, "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]):
        try:
            done = subprocess.run(
                argv, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, capture_output=True, text=True,
                timeout=900, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{' '.join(argv)}: {exc}"
        if done.returncode != 0:
            return f"{' '.join(argv)}: {(done.stderr or done.stdout).strip()[-500:]}"
    return None


def _config(root: Path, nodes: list[str], ports: list[int], controller_port: int) -> str:
    lines = [
        "ClusterName=mlmtest",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={controller_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire (120 s by default) is also how long a requeued job waits before it may start again (its old
        # credential is revoked on the nodes until then); 10 s keeps the requeue test short.
        f"AuthInfo=socket={root}/munge/munge.socket,cred_expire=10",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/spool/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        # Job ids from a random start: the launcher's port is 61000 + job id % 4536, and another run of this test
        # on the same machine must not meet this one's.
        f"FirstJobId={secrets.randbelow(4000) + 100}",
        # No cgroups here (a container): processes tracked by parentage, which also means a signal to a step reaches
        # every process of it, as proctrack/cgroup does on a real cluster.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "ReturnToService=2",
        "KillWait=10",
        "MailProg=/bin/true",
        *[
            f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs=1 State=UNKNOWN"
            for node, port in zip(nodes, ports, strict=True)
        ],
        f"PartitionName=test Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


@contextmanager
def slurm_cluster(root: Path, count: int = 2) -> Iterator[Cluster]:
    """A running cluster of ``count`` one-CPU nodes named mlmnode1.., its files under ``root``."""
    if os.geteuid() != 0:
        pytest.skip("Slurm test skipped: the test cluster's daemons run as root (slurmd starts jobs as any user)")
    if _missing():
        reason = _install()
        if _missing():
            pytest.skip(f"Slurm test skipped: {', '.join(_missing())} missing and not installable ({reason})")
    nodes = [f"mlmnode{i + 1}" for i in range(count)]
    for sub in ("munge", "state", "log", *(f"spool/{n}" for n in nodes)):
        (root / sub).mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # munged wants the path to its socket searchable by all
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    conf = root / "slurm.conf"
    conf.write_text(_config(root, nodes, [free_port() for _ in nodes], free_port()))
    hosts = root / "hosts"
    hosts.write_text(Path("/etc/hosts").read_text() + "".join(f"127.0.0.1 {n}\n" for n in nodes))
    munge = root / "munge"
    script = "\n".join(
        [
            "set -e",
            f"mount --bind {hosts} /etc/hosts",
            f"munged --foreground --force --socket={munge}/munge.socket --key-file={key} "
            f"--pid-file={munge}/munged.pid --seed-file={munge}/seed --log-file={root}/log/munged.log &",
            f"for _ in $(seq 100); do [ -S {munge}/munge.socket ] && break; sleep 0.1; done",
            "slurmctld -D &",
            *[f"slurmd -D -N {node} &" for node in nodes],
            "wait",
        ]
    )
    supervisor = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
        env={"PATH": _PATH, "SLURM_CONF": str(conf), "LANG": "C.UTF-8"},
        stdout=(root / "log" / "supervisor.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    cluster = Cluster(root, conf, nodes, supervisor)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            done = cluster.client("sinfo", "--noheader", "--Node", "--format=%N %t")
            states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
            if done.returncode == 0 and all(states.get(n) == "idle" for n in nodes):
                break
            if supervisor.poll() is not None or time.monotonic() > deadline:
                pytest.skip(
                    f"Slurm test skipped: the test cluster did not start in {START_TIMEOUT_S} s "
                    f"(sinfo: {done.stdout.strip() or done.stderr.strip()})\n{cluster.logs()}"
                )
            time.sleep(0.5)
        yield cluster
    finally:
        cluster.stop()
