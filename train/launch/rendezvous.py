"""The wait for the rendezvous address to resolve, and what to check when it never does.

A Kubernetes Service name appears some seconds after the pods start, and a Slurm node name need not be the host's
DNS name: the launcher waits for it (up to MLM_RDZV_TIMEOUT) before it starts torchrun, and doctor's master row
gives the same hint for the same name.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from train.common.errors import EXIT_CRASH, UserError


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


@dataclass(frozen=True)
class Lookup:
    """How the wait looks a name up and passes the time: the system's, or a test's."""

    resolve: Callable[[str], object] = lambda host: socket.getaddrinfo(host, None)
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic


def wait_for_address(
    host: str,
    source: str,
    timeout_s: float,
    log: Callable[[str], None],
    lookup: Lookup = Lookup(),
    environ: Mapping[str, str] = os.environ,
) -> int:
    """Wait until ``host`` resolves: a Kubernetes Service name appears some seconds after the pods start.

    Returns the number of failed attempts; raises a UserError with exit code 1 when ``timeout_s`` passes: not 3,
    because a master pod still Pending (no GPU free yet) is worth retrying, and the podFailurePolicy fails the Job
    at once on 3.
    """
    resolve, sleep, clock = lookup.resolve, lookup.sleep, lookup.clock
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
