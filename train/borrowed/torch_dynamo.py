"""What we borrow from torch.compile's internals (torch 2.15, ``torch/_dynamo/utils.py``): its counters, for the
benchmark (bench/probe.py). Nothing here imports torch until it is used."""

from __future__ import annotations

import sys

from train.borrowed.touch import borrows


@borrows("torch", "2.15", "_dynamo/utils.py counters")
def compile_counters() -> dict[str, dict[str, int]] | None:
    """What torch.compile did in this process: frames compiled, graphs, recompiles (torch 2.15,
    ``torch/_dynamo/utils.py``, the module-level ``counters``); None when dynamo was never imported. torch has no
    public counter of compiled frames and recompiles (``torch._logging`` prints, it does not count)."""
    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo.utils import counters  # loaded already (above): no import cost

    return {group: dict(counters[group]) for group in ("frames", "stats", "recompiles") if counters.get(group)}
