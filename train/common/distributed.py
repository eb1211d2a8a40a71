"""Where this process stands in the run's process group, asked one way everywhere.

torch.distributed answers only once the group is started (the Trainer's arguments start it); before that, and in
a process torchrun did not start, the environment torchrun sets (``RANK``) is the answer, and without it this is
the only process: rank 0 of a world of one.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from typing import Any, NoReturn

import torch.distributed as dist

from train.common.errors import exit_process, run_main


def initialized() -> bool:
    """Whether a process group is running (collectives would block on the other ranks)."""
    return dist.is_available() and dist.is_initialized()


def world_rank() -> int:
    return dist.get_rank() if initialized() else int(os.environ.get("RANK", "0"))


def several_ranks() -> bool:
    """Whether a process group with more than one rank is running (a collective has someone to talk to)."""
    return initialized() and dist.get_world_size() > 1


def is_world_zero() -> bool:
    """Whether this is world rank 0: the process that writes the run's files and speaks for all."""
    return world_rank() == 0


def gather_from_every_rank(mine: Any) -> list[Any]:
    """Every rank's ``mine``, in rank order (a collective: every rank calls it); ``[mine]`` without a process group.
    The values travel pickled between the run's own processes, never from a file."""
    if not initialized():
        return [mine]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def barrier() -> None:
    """Wait for every rank (nothing to wait for without a process group)."""
    if initialized():
        dist.barrier()


def end_process_group() -> None:
    """Destroy the process group and free it now, while the interpreter is whole.

    ``destroy_process_group`` only drops torch.distributed's own references: the DDP wrapper, the Trainer and the
    accelerator keep theirs in reference cycles, so the group's gloo worker threads (``pt_gloo_runloop``, and the
    transport's ``gloo_tcp_loop``) lived on into interpreter shutdown, where freeing them could end a rank that had
    finished its run with "terminate called without an active exception" (SIGABRT; stop 63's CI, rank 1 after
    "finished: model in ..."), and torchrun reported the run failed. One full collection after the destroy frees
    those cycles and joins the threads here: 0.24 s of a tiny two-rank run's exit, a rank that ran a group only."""
    if not initialized():
        return
    dist.destroy_process_group()
    gc.collect()


def run_and_exit(main: Callable[[list[str] | None], int]) -> NoReturn:
    """A program's ``if __name__ == "__main__":`` block, written once for the training job and every sub-command:
    ``main``'s exit code through run_main (a UserError as its one line and its code), the process group ended
    (end_process_group) whatever happened (a rank of the job, evaluate or finetune; prepare and average start none),
    then exit_process.
    Here, not in errors.py beside run_main: it needs torch.distributed, which the launcher's and ``help``'s light
    imports of errors.py must not pay for."""
    try:
        code = run_main(main)
    finally:
        end_process_group()
    exit_process(code)
