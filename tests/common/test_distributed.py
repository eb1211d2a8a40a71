"""How a rank ends its process group (train/common/distributed.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch.distributed as dist

from train.common.distributed import end_process_group


def gloo_threads() -> list[str]:
    """The names of this process's threads that belong to a gloo process group."""
    names = [Path(f"/proc/self/task/{task}/comm").read_text().strip() for task in os.listdir("/proc/self/task")]
    return [name for name in names if name.startswith(("pt_gloo", "gloo_"))]


def named_gloo_threads(within_s: float = 10.0) -> list[str]:
    """The gloo threads once they have named themselves (each sets its name as it starts: under load, a moment
    after the group is made)."""
    deadline = time.monotonic() + within_s
    while not (found := gloo_threads()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return found


def test_ending_the_group_joins_its_threads_while_a_cycle_still_holds_it() -> None:
    """A DDP model the Trainer keeps in a reference cycle holds the group past destroy_process_group; its gloo
    threads then died in interpreter shutdown, and could abort a rank that had finished (stop 63's CI)."""
    assert not dist.is_initialized(), "a test left a process group behind"
    assert gloo_threads() == []
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        holder: dict[str, object] = {"group": dist.group.WORLD}  # as the DDP wrapper's process_group
        holder["self"] = holder  # the cycle: only a collection frees it
        del holder
        assert named_gloo_threads() != []
        end_process_group()
        assert not dist.is_initialized()
        assert gloo_threads() == []
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
