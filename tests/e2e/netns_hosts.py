"""Several "hosts" on one machine: network namespaces joined by veth pairs, each with its own address.

Used by test_two_hosts.py to run a real two-node rendezvous across addresses that are not loopback. Needs root (or
CAP_NET_ADMIN) and iproute2's ``ip``; :func:`hosts` skips the test, with the reason, only where a namespace cannot be
created. Names are unique per call and everything is removed when the context ends, even after a failure. Only the
namespaces' own addresses are ever used.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest


@dataclass
class Host:
    """One network namespace with one veth end and an address."""

    namespace: str
    interface: str
    address: str
    processes: list[subprocess.Popen] = field(default_factory=list)

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside this host's network namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def start(self, argv: list[str], **popen: object) -> subprocess.Popen:
        """Start a process in the namespace."""
        process = subprocess.Popen(self.command(*argv), **popen)  # type: ignore[call-overload]
        self.processes.append(process)
        return process

    def pids(self) -> list[int]:
        """Every process in this namespace: only ours, since the namespace is new (torchrun puts each rank in a
        session of its own, so a process group would miss them)."""
        done = _ip("netns", "pids", self.namespace)
        return [int(pid) for pid in done.stdout.split()]

    def kill_all(self) -> None:
        """SIGKILL every process on this host at once, as when its pod is killed. (The kernel still closes their
        connections, so peers notice at once; a machine losing power would leave them to time out.)"""
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


def _probe() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (bash .ci/system-deps.sh installs it)"
    name = f"mlmprobe-{secrets.token_hex(4)}"
    made = _ip("netns", "add", name)
    if made.returncode != 0:
        return f"cannot create a network namespace (`ip netns add` needs root/CAP_SYS_ADMIN): {made.stderr.strip()}"
    _ip("netns", "del", name)
    return None


@contextmanager
def hosts(count: int = 2, subnet: str = "10.231.77") -> Iterator[list[Host]]:
    """``count`` namespaces on one link (a veth pair for two; more would need a bridge), addresses subnet.1, .2, ...

    The subnet exists only inside the new namespaces, so it cannot clash with the machine's own networks.
    """
    assert count == 2, "a veth pair joins exactly two namespaces"
    reason = _probe()
    if reason:
        pytest.skip(f"two-host test skipped: {reason}")
    token = secrets.token_hex(3)  # interface names are limited to 15 characters
    made: list[Host] = []
    try:
        for index in range(count):
            host = Host(f"mlm-{token}-{index}", f"mlm{token}v{index}", f"{subnet}.{index + 1}")
            check(_ip("netns", "add", host.namespace))
            made.append(host)
        a, b = made
        check(_ip("link", "add", a.interface, "type", "veth", "peer", "name", b.interface))
        for host in made:
            check(_ip("link", "set", host.interface, "netns", host.namespace))
            check(_ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface))
            check(_ip("-n", host.namespace, "link", "set", host.interface, "up"))
            check(_ip("-n", host.namespace, "link", "set", "lo", "up"))
        yield made
    finally:
        for host in made:
            host.kill_all()
        for host in made:
            # Deleting a namespace also deletes the veth end inside it (and so the pair).
            _ip("netns", "del", host.namespace)
        if made:
            _ip("link", "del", made[0].interface)  # only there if setup failed before moving it into a namespace


def check(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, f"{' '.join(done.args)}: {done.stderr.strip()}"
