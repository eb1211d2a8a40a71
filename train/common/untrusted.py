"""Reading a file the run did not write (a checkpoint from a shared volume or a bucket, a model someone handed
over): as data, never as code. torch.load runs only with ``weights_only=True`` (its restricted unpickler, which
refuses any object but tensors and plain containers before anything runs), under transformers' own allowlist of
numpy's types (its RNG state holds them); nothing in train/ unpickles otherwise (tests/test_untrusted.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers.trainer_pt_utils import safe_globals

from train.common.errors import first_line

# torch's words when its restricted unpickler refuses a file (torch 2.15, torch/serialization.py).
SAFE_LOAD_REFUSED = "Weights only load failed"


def safe_load_problem(path: Path) -> str | None:
    """The file as transformers loads it (weights_only=True, memory-mapped: the tensors are not read), or why the
    safe loader refuses it: a pickle that could run code is refused before anything runs."""
    try:
        with safe_globals():
            torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - any refusal of the safe loader makes the file unusable
        return f"{path.name}: fails the safe load ({first_line(exc)})"
    return None
