"""One job per output directory: a lease file, ``output_dir/.lease``, held by world rank 0 for the whole run.

What the Trainer lacks: nothing stops two jobs on one ``output_dir`` (a replacement pod while the old one still
runs, a person starting a run twice) from both training and overwriting each other's checkpoints and ``final/``.
``fcntl`` locks do not reach across the nodes of a shared volume (NFS, object-store mounts), so the lease is a
file created atomically (``O_EXCL``) holding its holder's host, process and start time, renewed by a heartbeat
(its modification time). A lease is stale when its holder is on this host and no longer running, or when its
heartbeat is older than :data:`EXPIRY_S` (a lost node); a stale lease is taken over.

A live holder on another host may be a pod being replaced: the new job waits up to ``wait_s`` seconds (the stop
timeout) for it to finish its checkpoint and let go. A live holder on this host is a second run: it fails at once.
Either failure is exit 3 with the holder named; the holder is unharmed.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from train.common.console import now
from train.common.errors import EnvironmentProblem
from train.outputs.runfiles import RunFiles

HEARTBEAT_S = 10.0
EXPIRY_S = 60.0


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/PID/stat): tells a reused pid from the holder."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def describe_holder(holder: dict[str, Any]) -> str:
    return f"pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('started')}"


class OutputLease:
    def __init__(self, files: RunFiles, label: str, clock: Callable[[], float] = time.time) -> None:
        self.path = files.lease
        self.label = label  # the option that named the directory, for messages
        self.clock = clock
        self.token = uuid.uuid4().hex
        self.record = {
            "token": self.token,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "start_time": _start_time(os.getpid()),
            "started": now(),
        }
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading the current holder --
    def holder(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # half-written by a holder that died at once: judged by its age alone

    def _here(self, holder: dict[str, Any]) -> bool:
        """The holder is a process of this host (judged by its process, not its heartbeat)."""
        return holder.get("host") == self.record["host"] and isinstance(holder.get("pid"), int)

    def _alive_here(self, holder: dict[str, Any]) -> bool:
        if not self._here(holder):
            return False
        started = _start_time(holder["pid"])
        return started is not None and started == holder.get("start_time")

    def stale(self, holder: dict[str, Any]) -> bool:
        if self._here(holder):
            return not self._alive_here(holder)
        try:
            age = self.clock() - self.path.stat().st_mtime
        except FileNotFoundError:
            return True
        return age > EXPIRY_S

    # -- taking and keeping it --
    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(self.record, handle)
        return True

    def _take_over(self) -> bool:
        """Replace a stale lease; of several jobs doing so at once, the one whose record stays wins."""
        tmp = self.path.with_name(f"{self.path.name}.{self.token}")
        tmp.write_text(json.dumps(self.record), encoding="utf-8")
        os.replace(tmp, self.path)
        time.sleep(0.2)  # let a concurrent taker's replace land before judging who won
        return (self.holder() or {}).get("token") == self.token

    def acquire(self, wait_s: float = 0.0, sleep: Callable[[float], None] = time.sleep) -> None:
        deadline = self.clock() + wait_s
        while True:
            if self._create():
                break
            holder = self.holder()
            if holder is None:
                continue  # released just now
            if self.stale(holder):
                if self._take_over():
                    break
                continue
            if self._alive_here(holder) or self.clock() >= deadline:
                raise EnvironmentProblem(
                    f"{self.label}={str(self.path.parent)!r} is in use by another run ({describe_holder(holder)}); "
                    "wait for it to end, stop it, or choose another output_dir"
                )
            sleep(min(HEARTBEAT_S, max(deadline - self.clock(), 0.1)))
        self._thread = threading.Thread(target=self._heartbeat, name="output-lease", daemon=True)
        self._thread.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if (self.holder() or {}).get("token") != self.token:
                    return  # taken over (we were judged lost): nothing of ours to renew
                os.utime(self.path)
            except OSError:
                continue  # a transient error on a network volume: try again at the next beat

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            if (self.holder() or {}).get("token") == self.token:
                self.path.unlink()
        except OSError:
            pass
