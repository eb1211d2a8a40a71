"""The one exception type for user-facing failures, and the exit codes the job documents.

Library code raises; only the outermost ``main`` turns a :class:`UserError` into one line on stderr and an exit
code, so every module stays testable. The codes are part of the public contract (docs/exit-codes.md, Kubernetes
podFailurePolicy):

====  =========================================================================================
0     success
2     configuration or input error: retrying cannot help
3     environment error: GPU required but absent, driver too old, output not writable, disk full
75    preempted (SIGTERM): a checkpoint was saved, running the same command again resumes (EX_TEMPFAIL)
76    hung: no rank of a node made progress within the hang bound; the launcher ended them (retry: it resumes)
1     a crash, or a transient failure worth retrying (a lost rank, a master that never resolved)
else  a crash (128+N: killed by signal N)
====  =========================================================================================
"""

from __future__ import annotations

import gc
import glob
import os
import signal
import sys
from collections.abc import Callable, Mapping
from typing import NoReturn

from train.borrowed.triton import triton_bindings_loaded
from train.common import console
from train.common.handoff import HANDOFF_ENV

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_CONFIG = 2
EXIT_ENVIRONMENT = 3
EXIT_PREEMPTED = 75
EXIT_HUNG = 76  # set by the launcher's hang watchdog (train/launch/watchdog.py), never by a rank
# The signals that mean "save a checkpoint and exit EXIT_PREEMPTED": SIGTERM (docker stop, the kubelet), SIGINT
# (Ctrl-C), SIGUSR1/SIGUSR2 (Slurm's --signal). The launcher forwards them, torchrun passes them on, the ranks act.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # 141: the reader of our output closed it, as for any shell tool


class UserError(Exception):
    """A failure the user can fix; carries its exit code and a one-line message."""

    exit_code = EXIT_CONFIG

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(UserError):
    """Bad configuration or input (exit code 2)."""

    exit_code = EXIT_CONFIG


class EnvironmentProblem(UserError):
    """The machine cannot run the job as asked (exit code 3)."""

    exit_code = EXIT_ENVIRONMENT


class Preempted(UserError):
    """A stop signal arrived and a checkpoint was saved (exit code 75): said as an info line, not an error."""

    exit_code = EXIT_PREEMPTED


# Ranks run under torchrun, whose own exit status is 1 whatever a rank exited with. Each rank therefore also
# records its documented exit code in a file the launcher reads back (MLM_EXIT_DIR, set by the launcher).
EXIT_DIR_ENV = "MLM_EXIT_DIR"


def record_exit_code(code: int, environ: Mapping[str, str] | None = None) -> None:
    """Leave this rank's exit code where the launcher finds it (no-op outside a launch)."""
    env = os.environ if environ is None else environ
    directory = env.get(EXIT_DIR_ENV)
    if not directory:
        return
    rank = env.get("RANK", "0")
    try:
        with open(os.path.join(directory, f"rank-{rank}.exit"), "w", encoding="utf-8") as handle:
            handle.write(str(code))
    except OSError:
        pass  # the exit status still carries the code for a single process


def read_exit_codes(directory: str) -> list[int]:
    """Exit codes recorded by the ranks of one launch."""
    codes = []
    for path in glob.glob(f"{directory}/rank-*.exit"):
        try:
            codes.append(int(open(path, encoding="utf-8").read().strip()))
        except (OSError, ValueError):
            continue
    return codes


# The codes a rank reports on purpose, in the order they win when ranks disagree.
def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's first non-empty line, at most ``limit`` characters; its type's name when it says nothing.
    A KeyError's message is its own (``str`` of a KeyError quotes it as the missing key's repr)."""
    said = exc.args[0] if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str) else exc
    lines = [text for text in str(said).strip().splitlines() if text.strip()]
    return (lines[0].strip() if lines else type(exc).__name__)[:limit]


DOCUMENTED_EXITS = (EXIT_CONFIG, EXIT_ENVIRONMENT, EXIT_PREEMPTED)


def debug_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """MLM_DEBUG=1: show tracebacks and torchrun's own failure reports instead of the one-line errors."""
    env = os.environ if environ is None else environ
    return env.get("MLM_DEBUG", "") not in ("", "0", "false")


def documented_exit(codes: list[int], fallback: int) -> int:
    """The exit code of a whole launch: a documented code reported by a rank wins over torchrun's generic 1."""
    for code in DOCUMENTED_EXITS:
        if code in codes:
            return code
    return fallback


def run_main(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Call ``main(argv)``; a UserError becomes one line on stderr and its exit code (MLM_DEBUG=1: traceback)."""
    try:
        return int(main(argv) or 0)
    except BrokenPipeError:
        # The reader went away (`doctor | head`): stop quietly, as a shell tool killed by SIGPIPE would, and keep
        # the interpreter's final flush from raising again on the closed pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except UserError as exc:
        record_exit_code(exc.exit_code)
        if debug_enabled():
            raise
        # A planned stop saved its checkpoint: said as news, not as an error.
        (console.say if isinstance(exc, Preempted) else console.error)(str(exc))
        return exc.exit_code


def exit_process(code: int) -> NoReturn:
    """``sys.exit(code)`` without the interpreter's last full garbage collection.

    A process that imported torch and transformers holds millions of objects, and the collection CPython runs
    while it shuts down walks them all for nothing: about 1 s of every rank's and 0.5 s of the launcher's exit
    here (``python -c "import train.run.job"`` 5.0 s, with ``gc.freeze()`` first 4.1 s; a tiny run of one rank from
    launch to exit 9.0 s against 7.8 s). Frozen objects are left to the operating system; everything else shutdown
    does still happens (atexit handlers, threads joined, modules cleared), so files, trackers and TensorBoard
    writers are flushed and closed as before.

    Once triton is loaded (torch 2.15 imports it with torch._dynamo, which transformers 5.25's models import), its
    nanobind bindings print a report of the objects still alive when they are torn down, after the process's last
    word: about 30 lines. A rank the launcher started (its handoff in the environment) freezes all the same: its
    stderr reaches the user through the launcher's relay, which drops that report (not under MLM_DEBUG=1, which
    keeps everything torchrun's ranks print). A rank under a bare torchrun or MLM_DEBUG=1, or any other process with
    triton loaded, takes the collection instead.
    """
    if not triton_bindings_loaded() or (HANDOFF_ENV in os.environ and not debug_enabled()):
        gc.freeze()
    sys.exit(code)


# What a killed process most likely met: one rule for a rank's DataLoader worker (train/run/crash.py) and for a
# rank the launcher saw killed (train/launch/torchrun.py).
OOM_KILLER = "most often the out-of-memory killer"
RANK_REMEDY = "raise the memory limit or lower the batch size"


def why_killed(signal_name: str, remedy: str) -> str:
    """What a process killed by ``signal_name`` most likely met, and ``remedy`` for the out-of-memory killer."""
    if signal_name == "SIGKILL":
        return f"{OOM_KILLER} - {remedy}"
    if signal_name == "SIGBUS":
        return "SIGBUS is most often a /dev/shm too small (docker run --ipc=host)"
    return "check the machine's logs"


def signal_named(description: str) -> str:
    """SIGKILL for strsignal's "Killed"; the description itself when no signal has it."""
    for candidate in signal.Signals:
        if signal.strsignal(candidate) == description.strip():
            return candidate.name
    return description.strip()
