"""What our launcher (train/launch) would decide for a benchmark run, as the flags it would hand the rank.

The benchmark starts each rank with a bare ``torchrun`` (bench/runner.py), not through our launcher, so that both
series time the rank alone; our recipes must still train as the launcher would have them train. The rules are the
launcher's own (train/launch/decide.py), asked here with the inputs of a user who chose neither option.
"""

from __future__ import annotations

from train.config import DataArguments
from train.launch.decide import decide_pad_multiple, decide_precision

# The compute capability the GPU runs are decided for: every GPU in bench/flops.py's peak table (A100, H100, H200)
# is Ampere or newer, so the launcher gives them bf16 + tf32.
AMPERE = (8, 0)


def precision_flags(device: str) -> list[str]:
    """bf16 + tf32 on a GPU; nothing on a CPU (fp32)."""
    capability = AMPERE if device == "cuda" else None
    return list(decide_precision(False, False, None, {}, capability).flags)


def padding_flags(device: str) -> list[str]:
    """On a CPU, pad each batch to its longest sample (no tensor cores to round for); on a GPU, nothing."""
    return list(decide_pad_multiple(DataArguments.pad_to_multiple_of, None, device == "cpu"))
