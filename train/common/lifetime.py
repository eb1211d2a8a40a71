"""How the processes of a run end together: a child that outlives its parent is killed with it, and a rank that
ends takes its data loader workers with it.

What the libraries lack: Linux does not end a process's children when it dies, and a DataLoader worker ignores the
stop signals (train/run/preemption.py: so that torchrun's killpg reaches only the rank, which saves a checkpoint).
At interpreter exit ``multiprocessing`` SIGTERMs its children and then joins them; a worker that ignores SIGTERM
is never joined and the rank never exits (seen: a rank whose DataLoader raised after the OOM killer took one
worker, idle in ``multiprocessing.util._exit_function`` for good, and its pod holding the GPUs until a deadline).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Have the kernel send ``signum`` to this process when its parent dies (Linux; elsewhere nothing)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signum)
    except (OSError, AttributeError):
        pass


def end_children(timeout_s: float = 5.0) -> int:
    """SIGKILL this process's multiprocessing children (data loader workers, tokenization pools) and reap them, so
    that the interpreter's exit does not wait on one that ignores SIGTERM. Returns how many were still alive.
    Call it only on the way out: nothing of theirs is needed any more."""
    children = multiprocessing.active_children()
    if children:
        # torch's DataLoader handles SIGCHLD by raising "DataLoader worker ... is killed by signal" in the rank:
        # these deaths are ours, and that exception would replace the one the rank is exiting with.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in children:
        if child.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
    for child in children:
        child.join(timeout_s)
    return len(children)
