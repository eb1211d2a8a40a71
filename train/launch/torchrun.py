"""Running torchrun: as a child in its own process group, its stderr relayed, SIGTERM/SIGINT forwarded, and its
exit status translated into the documented exit codes the ranks reported (errors.py). torchrun's own main runs in a
fork of the launcher, which has imported torch already (a fresh `torchrun` spends 1.5 s of every run starting Python
and importing torch again before its agent starts a rank).

What torchrun lacks for a container's PID 1: its exit status is 1 whatever a rank exited with (so the ranks record
their code in ``MLM_EXIT_DIR``), and its agent prints a traceback and a summary table after a rank that already
said in one line what went wrong (held back and dropped, unless MLM_DEBUG=1).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from train.borrowed.stdlib import forget_exit_handlers, run_exit_handlers
from train.borrowed.torchrun import agent_reports_a_failure, is_agent_signal_exception, rank_killed_by_signal
from train.borrowed.triton import leak_report_part, may_become_leak_report
from train.common.errors import (
    DOCUMENTED_EXITS,
    EXIT_CRASH,
    EXIT_DIR_ENV,
    EXIT_PREEMPTED,
    RANK_REMEDY,
    STOP_SIGNALS,
    debug_enabled,
    documented_exit,
    read_exit_codes,
    why_killed,
)
from train.common.lifetime import die_with_parent
from train.launch.plan import Plan, torchrun_path
from train.launch.rendezvous import wait_for_address


def _child_env(environ: Mapping[str, str], plan: Plan, exit_dir: str) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if not k.startswith("PET_")}
    env.update(plan.env)
    env.update(plan.secret_env)
    env[EXIT_DIR_ENV] = exit_dir
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class ForkedTorchrun:
    """torchrun's main (``torch.distributed.run``, the code behind the ``torchrun`` command) in a fork of the
    launcher, with what run_torchrun uses of a Popen: ``pid``, ``stderr``, ``send_signal``, ``wait``.

    Why a fork rather than the command: torch is imported here already, and the agent runs nothing else; its ranks
    are still fresh processes it starts with the same command line (each in its own session), so a rank cannot tell
    the difference. The child is set up as Popen would set up a new `torchrun` process: its own process group,
    SIGTERM when the launcher dies, stderr into the pipe, the ranks' environment in os.environ (the agent gives its
    environment to the ranks), Python's initial signal handlers, none of the launcher's atexit handlers; and it
    leaves through os._exit, so that nothing of the launcher's stack (its finally blocks) runs in it. (In ps its
    command line is the launcher's; torchrun names its main thread pt_elastic either way.)
    """

    def __init__(self, arguments: Sequence[str], env: Mapping[str, str]) -> None:
        read_fd, write_fd = os.pipe()
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            if stream is not None:
                stream.flush()  # or what is buffered would be written twice
        launcher = os.getpid()
        # Stop signals are held across the fork: the child resets the launcher's handlers before it takes them,
        # and the launcher takes them once it knows the child's pid.
        previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            with warnings.catch_warnings():  # Python 3.12 warns of fork with threads; the child runs no other's
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                self._agent(list(arguments), env, (read_fd, write_fd), previous_mask, launcher)
            os.close(write_fd)
            with contextlib.suppress(OSError):  # here too: a signal to our group must not find it still in it
                os.setpgid(pid, pid)
        except BaseException:
            os.close(read_fd)
            with contextlib.suppress(OSError):
                os.close(write_fd)
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        self.pid = pid
        self.returncode: int | None = None
        self.stderr: io.BufferedReader = open(read_fd, "rb")  # noqa: SIM115 (closed in wait)

    @staticmethod
    def _agent(
        arguments: list[str],
        env: Mapping[str, str],
        pipe: tuple[int, int],
        mask: set[int | signal.Signals],
        launcher: int,
    ) -> NoReturn:
        """The child: everything inside one try, which ends in os._exit whatever happens."""
        code: int | None = 1  # None: interrupted, die of SIGINT as Python does
        try:
            os.close(pipe[0])
            os.setpgid(0, 0)
            die_with_parent()  # in torchrun's process: a killed launcher must not leave ranks behind
            if os.getppid() != launcher:  # it died before the line above could take effect
                os._exit(128 + signal.SIGTERM)
            os.dup2(pipe[1], 2)
            os.close(pipe[1])
            sys.stderr = sys.__stderr__ or sys.stderr  # fd 2, the pipe now (a harness may have replaced sys.stderr)
            for signum in STOP_SIGNALS:
                signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.environ.clear()
            os.environ.update(env)
            # The exit handlers registered so far are the launcher's libraries' (what they clean up is the
            # launcher's: its temporary files, its logging); those the agent registers from here on run below.
            forget_exit_handlers()
            sys.argv = ["torchrun", *arguments]
            from torch.distributed.run import main

            main(arguments)
            code = 0
        except SystemExit as stop:  # as Python exits on it: an int as it is, None 0, anything else printed and 1
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
        except KeyboardInterrupt:  # a SIGINT before torchrun's handlers: the traceback, then death by SIGINT
            traceback.print_exc()
            code = None
        except BaseException:  # as the command ends on an exception: its traceback (the relay knows it), 1
            traceback.print_exc()
        finally:
            with contextlib.suppress(BaseException):
                run_exit_handlers()
                sys.stdout.flush()
                sys.stderr.flush()
            if code is None:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGINT)
            os._exit(128 + signal.SIGINT if code is None else code)

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
            self.stderr.close()
        return self.returncode


def start_torchrun(command: Sequence[str], env: Mapping[str, str]) -> ForkedTorchrun | subprocess.Popen[bytes]:
    """This environment's torchrun (torchrun_path) as a fork on Linux; any other command (the tests' stand-ins),
    or elsewhere, as one (macOS's system frameworks are not safe to fork once loaded, as multiprocessing's spawn
    default there says)."""
    program = torchrun_path()
    if list(command[: len(program)]) == program and sys.platform == "linux":
        return ForkedTorchrun(command[len(program) :], env)
    return subprocess.Popen(
        list(command), env=dict(env), process_group=0, preexec_fn=die_with_parent, stderr=subprocess.PIPE
    )


# torchrun's agent reports a failed rank with an ERROR log line followed by its own traceback and a summary table;
# and when it stops on a signal it ends with the traceback of its own SignalException (their text:
# train/borrowed/torchrun.py). When the ranks exited with a documented code they have already printed the one line
# a user needs, so both are held back and dropped.
_TRACEBACK = b"Traceback (most recent call last):"
# Python's words between the tracebacks of a chain: a stop signal that lands while the agent handles another
# exception (torch 2.15: a logging call's cache miss, KeyError) ends in a chain whose last exception is the signal's.
_CHAINED = (
    b"During handling of the above exception, another exception occurred:",
    b"The above exception was the direct cause of the following exception:",
)
# c10d warns on every connection whose peer has no reverse DNS name, which is the rule in containers and network
# namespaces ("W... socket.cpp:...] [c10d] The hostname of the client socket cannot be retrieved. err=-3"): news to
# nobody, and not a JSON line in JSON mode. Dropped (MLM_DEBUG=1 keeps them), as is the leak report triton's bindings
# print after a rank's last word (train/common/errors.py exit_process).
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
        self.exception = b""  # its last exception line so far ("" while a traceback of the chain is still open)

    def _line(self, line: bytes) -> None:
        if not self.keep_noise and _NOISE.search(line):
            return
        if not self.keep_noise and (dropped := leak_report_part(line)):
            if line[dropped:].strip():  # a line glued to the report's last one, which has no newline
                self._line(line[dropped:])
            return
        if self.reporting or (self.traceback is None and agent_reports_a_failure(line)):
            # Only the report holds back what follows it; a held SignalException traceback does not (a second
            # stop signal, e.g. Slurm's to every process of the step, can land while the agent logs: the ranks'
            # own lines after it must still come through).
            self.reporting = True
            self.held.append(line)
        elif self.traceback is not None:
            if self.exception and line.strip() and not line.startswith(_TRACEBACK) and line.strip() not in _CHAINED:
                self._end_traceback()  # the chain ended with the exception line before this one
                self._line(line)
                return
            self.traceback.append(line)
            if line.startswith(_TRACEBACK) or line.strip() in _CHAINED:
                self.exception = b""
            elif line.strip() and not line[:1].isspace():  # an exception line: the chain may go on after it
                self.exception = line
        elif line.startswith(_TRACEBACK):
            self.traceback = [line]
        else:
            self.sink.write(line)

    def _end_traceback(self) -> None:
        """A whole chain of tracebacks: held back when its last exception is the agent's stop signal."""
        block, self.traceback, last, self.exception = self.traceback or [], None, self.exception, b""
        if is_agent_signal_exception(last):
            self.held += block
        else:
            self.sink.write(b"".join(block))

    def feed(self, chunk: bytes) -> None:
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            self._line(line + b"\n")
        # Progress bars redraw with \r and no newline: show them now, unless this may start a held line.
        if self.partial and not self.reporting and self.traceback is None and not self._may_be_held(self.partial):
            self.sink.write(self.partial)
            self.partial = b""
        self.sink.flush()

    def _may_be_held(self, partial: bytes) -> bool:
        """Whether a line whose end has not arrived may turn out to be held back or dropped: a log line of torchrun's
        agent (its level's letter first) or a line of the leak report."""
        return re.match(rb"[EWIT]", partial) is not None or (not self.keep_noise and may_become_leak_report(partial))

    def finish(self, drop_report: bool) -> None:
        if self.partial:
            self._line(self.partial)
            self.partial = b""
        if self.traceback is not None and self.exception:
            self._end_traceback()
        elif self.traceback is not None:  # cut off: not a report, show it
            self.sink.write(b"".join(self.traceback))
        if not drop_report:
            self.sink.write(b"".join(self.held))
        self.sink.flush()


# Deliveries of one signal closer together than this are one press: `timeout` and other wrappers re-send to their
# child the signal the whole process group got, so one Ctrl-C arrives twice within a millisecond or so; a person
# pressing twice is several times slower than this.
ONE_PRESS_S = 0.2


def killed_rank(report: bytes) -> str | None:
    """One line for the agent's report of a rank that died of a signal (its root cause), or None."""
    found = rank_killed_by_signal(report)
    if found is None:
        return None
    rank, signum = found
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return f"rank {rank} was killed ({name}): {why_killed(name, RANK_REMEDY)}; checkpoints saved before are intact"


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
    child: ForkedTorchrun | subprocess.Popen[bytes] | None = None
    received: list[int] = []
    pending: list[int] = []  # received before torchrun started
    aborted: list[int] = []
    delivered: dict[int, float] = {}  # when each signal last arrived

    def forward(signum: int, _frame: object) -> None:
        at = time.monotonic()
        if delivered.get(signum, -ONE_PRESS_S) > at - ONE_PRESS_S:
            return  # the same press again: a wrapper (timeout, a shell) re-sent what the group received
        delivered[signum] = at
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
        child = start_torchrun(command, env)
        for signum in pending:  # arrived before torchrun existed
            child.send_signal(signum)
        assert isinstance(child.stderr, io.BufferedReader)  # both ways opened unbuffered bytes: "rb", PIPE
        while chunk := child.stderr.read1(65536):
            relay.feed(chunk)
        status = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    codes = read_exit_codes(exit_dir)
    # A rank that recorded its code has said in one line what went wrong; one that died of a signal could not,
    # and the agent's report says which it was. When torchrun itself succeeded, what it held back is the report of
    # an attempt it restarted (--max-restarts) and the lines of the attempt that finished: shown, not dropped.
    cause = None if aborted or documented_exit(codes, 0) else killed_rank(b"".join(relay.held))
    recorded = bool(codes) and status != 0
    relay.finish(drop_report=(bool(aborted) or recorded or cause is not None) and not debug)
    if cause:
        log(cause, "error")
    if aborted:
        if EXIT_PREEMPTED in codes:  # the ranks finished saving before the second press: their 75 stands
            log("the ranks had saved a checkpoint before the second SIGINT: running again resumes from it")
        return 128 + signal.SIGINT, codes
    # A negative status is death by that signal: report it the way a shell does.
    return (128 + -status if status < 0 else status), codes


def launch(plan: Plan, environ: Mapping[str, str], log: Callable[..., None], rdzv_timeout: int) -> int:
    target = plan.topology.address_to_wait_for
    if target:
        wait_for_address(*target, timeout_s=rdzv_timeout, log=lambda m: log(m, "warning"), environ=environ)
    exit_dir = tempfile.mkdtemp(prefix="mlm-exit-")
    try:
        log("torchrun: " + " ".join(plan.command))
        child_env = _child_env(environ, plan, exit_dir)
        status, codes = run_torchrun(plan.command, child_env, log, exit_dir, debug_enabled(environ))
    finally:
        shutil.rmtree(exit_dir, ignore_errors=True)
    # Every rank of this node recorded 0: they finished the run after a stop signal (train/run/budget.py), and
    # torchrun, signalled, exits 1 whatever its ranks did.
    finished = len(codes) == plan.nproc_per_node and not any(codes)
    code = 0 if status == 0 or finished else documented_exit(codes, status)
    if code in DOCUMENTED_EXITS:
        log(f"exit {code}, as the ranks reported (see the line above)")
    elif code and EXIT_CRASH in codes:
        log(f"exit {code}: a rank crashed (see the line above)", "error")
    elif code:
        log(f"torchrun exited {status}; no rank reported an exit code: a crash", "error")
    return code
