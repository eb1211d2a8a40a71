"""Running torchrun: as a child in its own process group, its stderr relayed, SIGTERM/SIGINT forwarded, and its
exit status translated into the documented exit codes the ranks reported (errors.py).

What torchrun lacks for a container's PID 1: its exit status is 1 whatever a rank exited with (so the ranks record
their code in ``MLM_EXIT_DIR``), and its agent prints a traceback and a summary table after a rank that already
said in one line what went wrong (held back and dropped, unless MLM_DEBUG=1).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from train.errors import (
    DOCUMENTED_EXITS,
    EXIT_DIR_ENV,
    EXIT_PREEMPTED,
    STOP_SIGNALS,
    debug_enabled,
    documented_exit,
    read_exit_codes,
)
from train.launch.plan import Plan
from train.launch.topology import wait_for_address


def _child_env(environ: Mapping[str, str], plan: Plan, exit_dir: str) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if not k.startswith("PET_")}
    env.update(plan.env)
    env.update(plan.secret_env)
    env[EXIT_DIR_ENV] = exit_dir
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _die_with_parent() -> None:
    """In torchrun's process: get SIGTERM if the launcher dies (a killed launcher must not leave ranks behind)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# torchrun's agent reports a failed rank with an ERROR log line ("E1130 12:00:00.000 123 .../api.py:1002] failed
# (exitcode: 2) ...") followed by its own traceback and a summary table; and when it stops on a signal it ends with
# the traceback of its own SignalException. When the ranks exited with a documented code they have already printed
# the one line a user needs, so both are held back and dropped.
_AGENT_REPORT = re.compile(rb"^[EWI]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ .*torch/distributed/elastic/.*\] failed")
_TRACEBACK = b"Traceback (most recent call last):"
# c10d warns on every connection whose peer has no reverse DNS name, which is the rule in containers and network
# namespaces ("W... socket.cpp:...] [c10d] The hostname of the client socket cannot be retrieved. err=-3"): news to
# nobody, and not a JSON line in JSON mode. Dropped (MLM_DEBUG=1 keeps them).
_NOISE = re.compile(rb"\[c10d\] The hostname of the client socket cannot be retrieved")


class _StderrRelay:
    """Passes torchrun's stderr through as it comes, holding back the agent's failure report and its signal
    traceback until the exit code says whether they are news."""

    def __init__(self, sink: Any, keep_noise: bool = False) -> None:
        self.sink = sink
        self.keep_noise = keep_noise
        self.partial = b""
        self.held: list[bytes] = []
        self.reporting = False  # inside the agent's failure report: everything up to the exit is part of it
        self.traceback: list[bytes] | None = None  # a traceback being read: shown once it turns out not torchrun's

    def _line(self, line: bytes) -> None:
        if not self.keep_noise and _NOISE.search(line):
            return
        if self.reporting or (self.traceback is None and _AGENT_REPORT.match(line)):
            # Only the report holds back what follows it; a held SignalException traceback does not (a second
            # stop signal, e.g. Slurm's to every process of the step, can land while the agent logs: the ranks'
            # own lines after it must still come through).
            self.reporting = True
            self.held.append(line)
        elif self.traceback is not None:
            self.traceback.append(line)
            if not line[:1].isspace() and not line.startswith(_TRACEBACK):  # the exception line ends it
                block, self.traceback = self.traceback, None
                if b"torch.distributed.elastic.multiprocessing.api.SignalException" in line:
                    self.held += block
                else:
                    self.sink.write(b"".join(block))
        elif line.startswith(_TRACEBACK):
            self.traceback = [line]
        else:
            self.sink.write(line)

    def feed(self, chunk: bytes) -> None:
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            self._line(line + b"\n")
        # Progress bars redraw with \r and no newline: show them now, unless this may start a held line.
        if self.partial and not self.reporting and self.traceback is None and not re.match(rb"[EWIT]", self.partial):
            self.sink.write(self.partial)
            self.partial = b""
        self.sink.flush()

    def finish(self, drop_report: bool) -> None:
        if self.partial:
            self._line(self.partial)
            self.partial = b""
        if self.traceback is not None:  # cut off: not a report, show it
            self.sink.write(b"".join(self.traceback))
        if not drop_report:
            self.sink.write(b"".join(self.held))
        self.sink.flush()


def _children(pid: int) -> list[int]:
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        return [int(c) for task in tasks for c in (task / "children").read_text().split()]
    except OSError:
        return []


def abort(torchrun_pid: int) -> None:
    """SIGKILL the ranks and torchrun. torchrun starts each rank in a session of its own, so killing torchrun
    alone would leave them running; they and their data loader workers are each rank's process group."""
    for rank in _children(torchrun_pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(rank, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(torchrun_pid, signal.SIGKILL)


def run_torchrun(
    command: Sequence[str], env: Mapping[str, str], log: Callable[..., None], exit_dir: str, debug: bool = False
) -> tuple[int, list[int]]:
    """Run torchrun as a child in its own process group, forwarding the stop signals (a second SIGINT aborts).

    Returns its exit status and the exit codes the ranks recorded in ``exit_dir``.

    Its own group: a Ctrl-C on a terminal reaches only the launcher, which forwards it once (torchrun passes it
    on to the ranks), instead of every process receiving it twice. The handlers are in place before the child
    starts, so a signal arriving in between is held and delivered, not lost. Its stderr is relayed so that the
    agent's failure report can be dropped when a rank already said what went wrong (MLM_DEBUG=1 keeps it).
    """
    child: subprocess.Popen[bytes] | None = None
    received: list[int] = []
    pending: list[int] = []  # received before torchrun started
    aborted: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if signum == signal.SIGINT and signal.SIGINT in received:
            log("second SIGINT: stopping at once, without a checkpoint", "warning")
            aborted.append(signum)
            if child is not None:
                abort(child.pid)
            return
        received.append(signum)
        log(f"{signal.Signals(signum).name} received: passing it to torchrun (the ranks save a checkpoint, exit 75)")
        if child is None:
            pending.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    relay = _StderrRelay(sys.stderr.buffer, keep_noise=debug)
    try:
        child = subprocess.Popen(
            list(command), env=dict(env), process_group=0, preexec_fn=_die_with_parent, stderr=subprocess.PIPE
        )
        for signum in pending:  # arrived before torchrun existed
            child.send_signal(signum)
        assert child.stderr is not None
        while chunk := child.stderr.read1(65536):
            relay.feed(chunk)
        status = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    codes = read_exit_codes(exit_dir)
    relay.finish(drop_report=(bool(aborted) or documented_exit(codes, 0) != 0) and not debug)
    if aborted:
        if EXIT_PREEMPTED in codes:  # the ranks finished saving before the second press: their 75 stands
            log("the ranks had saved a checkpoint before the second SIGINT: running again resumes from it")
        return 128 + signal.SIGINT, codes
    # A negative status is death by that signal: report it the way a shell does.
    return (128 + -status if status < 0 else status), codes


def launch(plan: Plan, environ: Mapping[str, str], log: Callable[..., None], rdzv_timeout: int) -> int:
    target = plan.topology.address_to_wait_for
    if target:
        wait_for_address(*target, timeout_s=rdzv_timeout, log=lambda m: log(m, "warning"))
    exit_dir = tempfile.mkdtemp(prefix="mlm-exit-")
    try:
        log("torchrun: " + " ".join(plan.command))
        child_env = _child_env(environ, plan, exit_dir)
        status, codes = run_torchrun(plan.command, child_env, log, exit_dir, debug_enabled(environ))
    finally:
        shutil.rmtree(exit_dir, ignore_errors=True)
    code = 0 if status == 0 else documented_exit(codes, status)
    if code in DOCUMENTED_EXITS:
        log(f"exit {code}, as the ranks reported (see the line above)")
    elif code:
        log(f"torchrun exited {status}; no rank reported a documented exit code: a crash", "error")
    return code
