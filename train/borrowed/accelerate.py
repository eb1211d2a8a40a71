"""What we borrow from accelerate (accelerate 1.16, ``accelerate/accelerator.py``): how a model that is already
sharded (FSDP2, train/run/sharding.py) gets through ``Accelerator.prepare`` and its gradient accumulation."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from train.borrowed.touch import borrows


@borrows("accelerate", "1.16", "accelerator.py Accelerator.prepare_model (_is_accelerate_prepared)")
def leave_unwrapped(model: Any) -> None:
    """Mark ``model`` as prepared, so that ``Accelerator.prepare`` returns it as it is (accelerate 1.16,
    ``accelerator.py``, ``prepare_model``: ``if getattr(model, "_is_accelerate_prepared", False): return model``).
    Without it CPU ranks wrap the DTensor model in DDP, which fails, and GPU ranks raise. accelerate turns FSDP on
    only for accelerator distributed types and has no public way to hand it a model sharded already."""
    model._is_accelerate_prepared = True


@borrows("accelerate", "1.16", "accelerator.py Accelerator.no_sync (model.no_sync)")
def give_no_sync(model: Any) -> None:
    """Give the FSDP2 ``model`` the ``no_sync`` context that gradient accumulation asks a DDP model for (accelerate
    1.16, ``accelerator.py``, ``Accelerator.no_sync``: ``getattr(model, "no_sync", nullcontext)`` outside its own
    FSDP2 path), so that the reduce-scatter of all but the last micro-batch is skipped. A patch of the model:
    accelerate's own FSDP2 branch needs its FSDP plugin, which a model sharded by us has not."""

    @contextlib.contextmanager
    def no_sync() -> Iterator[None]:
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    model.no_sync = no_sync
