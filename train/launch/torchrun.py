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
from typing import NoReturn

from train.borrowed.stdlib import forget_exit_handlers, run_exit_handlers
from train.borrowed.torchrun import rank_killed_by_signal
from train.common.errors import (
    DOCUMENTED_EXITS,
    EXIT_CRASH,
    EXIT_DIR_ENV,
    EXIT_HUNG,
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
from train.launch.relay import StderrRelay
from train.launch.rendezvous import wait_for_address
from train.launch.watchdog import HangBound, HangWatch


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
    command: Sequence[str],
    env: Mapping[str, str],
    log: Callable[..., None],
    exit_dir: str,
    debug: bool = False,
    watch: HangWatch | None = None,
) -> tuple[int, list[int]]:
    """Run torchrun as a child in its own process group, forwarding the stop signals (a second SIGINT aborts).

    Returns its exit status and the exit codes the ranks recorded in ``exit_dir``.

    Its own group: a Ctrl-C on a terminal reaches only the launcher, which forwards it once (torchrun passes it
    on to the ranks), instead of every process receiving it twice. The handlers are in place before the child
    starts, so a signal arriving in between is held and delivered, not lost. Its stderr is relayed so that the
    agent's failure report can be dropped when a rank already said what went wrong (MLM_DEBUG=1 keeps it).
    ``watch``, the hang watchdog, runs while torchrun does; a node it ended says nothing more than its verdict.
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
    relay = StderrRelay(sys.stderr.buffer, keep_noise=debug)
    try:
        child = start_torchrun(command, env)
        for signum in pending:  # arrived before torchrun existed
            child.send_signal(signum)
        if watch is not None:
            watch.start(child.pid)
        assert isinstance(child.stderr, io.BufferedReader)  # both ways opened unbuffered bytes: "rb", PIPE
        while chunk := child.stderr.read1(65536):
            relay.feed(chunk)
        status = child.wait()
    finally:
        if watch is not None:
            watch.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    codes = read_exit_codes(exit_dir)
    if watch is not None and watch.verdict:
        relay.finish(drop_report=not debug)
        return status, codes
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


def launch(
    plan: Plan, environ: Mapping[str, str], log: Callable[..., None], rdzv_timeout: int, hang: HangBound | None = None
) -> int:
    """torchrun with the plan, watched for hangs under ``hang`` (train/launch/watchdog.py; None: not watched, as
    for a stand-in of torchrun); the documented exit code."""
    target = plan.topology.address_to_wait_for
    if target:
        wait_for_address(*target, timeout_s=rdzv_timeout, log=lambda m: log(m, "warning"), environ=environ)
    exit_dir = tempfile.mkdtemp(prefix="mlm-exit-")
    nodes = plan.topology.max_nodes
    watch = HangWatch(exit_dir, plan.nproc_per_node, hang, abort, nodes=nodes) if hang is not None else None
    try:
        log("torchrun: " + " ".join(plan.command))
        child_env = _child_env(environ, plan, exit_dir)
        status, codes = run_torchrun(plan.command, child_env, log, exit_dir, debug_enabled(environ), watch)
    finally:
        shutil.rmtree(exit_dir, ignore_errors=True)
    if watch is not None and watch.verdict:
        log(watch.verdict, "error")
        return EXIT_HUNG
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
