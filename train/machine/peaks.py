"""A device's peak rate of matrix arithmetic: what model FLOPs utilisation (MFU, train/run/diagnostics.py) is a share
of, and what doctor shows it against.

A GPU's peak is its datasheet's dense (not 2:4 sparse) tensor-core rate for the run's precision, from the table
below, matched on the name NVML gives; a GPU not in the table has no peak, and its runs no MFU, rather than a guess.
A CPU has no datasheet we could read: its peak is measured once per machine, by a short probe of float32 matrix
products on the threads the rank uses (tens of milliseconds; torch's own thread count put back after), and kept in
the job's cache (``HF_HOME/mlm-trainer``) under the CPU's model, the thread count and torch's version, so later runs
read it. That cache is data: a value that is not a positive number is measured again.

:func:`device_peak` is the one rule: the ranks (train/run/diagnostics.py ``rank_peak``) and doctor's row call it.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

TERA = 1e12

# Dense tensor-core TFLOP/s by precision, from NVIDIA's datasheets (sparse figures are twice these). Matched in
# order on the NVML name: the more specific names first ("H100 PCIe" before "H100"). "tf32": float32 matmuls on
# tensor cores (the precision's "+ tf32"); "fp32": without them.
GPU_PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200 NVL", {"bf16": 835.0, "fp16": 835.0, "tf32": 417.5, "fp32": 60.0}),
    ("H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("H100 NVL", {"bf16": 835.0, "fp16": 835.0, "tf32": 417.5, "fp32": 60.0}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("A10G", {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
    ("T4", {"fp16": 65.0, "fp32": 8.1}),
)

PROBE_SIZE = 512  # 0.27 GFLOP a product, milliseconds on a core; 1024 and 2048 measured the same rate here
PROBE_REPEATS = 8
CACHE_FILE = "cpu-peak.json"


@dataclass(frozen=True)
class Peak:
    """A device's peak in FLOP/s, and where that figure comes from, in words (doctor and docs show it)."""

    flops: float
    source: str


def matmul_precision(precision: str) -> str:
    """The precision the matrix products of a run at ``precision`` (the handoff's label: "bf16", "fp32 + tf32")
    run in: bf16 or fp16 when mixed precision is on, else tf32 where it is allowed, else fp32."""
    name = precision.split("+")[0].strip()
    if name in ("bf16", "fp16"):
        return name
    return "tf32" if "tf32" in precision else "fp32"


def gpu_peak(name: str, precision: str) -> Peak | None:
    """The table's dense peak of the GPU called ``name`` (as NVML names it) at the run's ``precision``; None for a
    GPU or precision the table lacks."""
    wanted = matmul_precision(precision)
    for model, rates in GPU_PEAKS:
        if model.lower() in name.lower():
            rate = rates.get(wanted)
            if rate is None:
                return None
            return Peak(rate * TERA, f"{model}'s datasheet, dense {wanted}: {rate:g} TFLOP/s")
    return None


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure_cpu_flops(threads: int, size: int = PROBE_SIZE, repeats: int = PROBE_REPEATS) -> float:
    """The best rate of ``repeats`` float32 ``size`` x ``size`` matrix products on ``threads`` torch threads, after
    one to warm up; torch's own thread count is put back after (doctor probes for the plan's count, not its own)."""
    import torch  # only where a probe runs: doctor's light paths need no torch for a GPU

    own = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        torch.mm(a, b)
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(own)
    return 2 * size**3 / max(best, 1e-9)


def cpu_peak(cache_dir: Path, threads: int, torch_version: str) -> Peak:
    """This machine's float32 peak on ``threads`` threads: from the cache in ``cache_dir`` when it holds one for
    this CPU, thread count and torch version, else measured (:func:`measure_cpu_flops`) and kept there (a cache
    that cannot be written is left alone: the next run measures again)."""
    key = f"{cpu_model()} | {threads} threads | torch {torch_version}"
    path = cache_dir / CACHE_FILE
    try:
        known = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}
    known = known if isinstance(known, dict) else {}
    value = known.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return Peak(float(value), f"measured on this CPU ({threads} threads, float32 matmul), cached in {path}")
    flops = measure_cpu_flops(threads)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{CACHE_FILE}.{os.getpid()}")
        partial.write_text(json.dumps({**known, key: flops}, indent=1), encoding="utf-8")
        partial.replace(path)
    except OSError:
        pass
    return Peak(flops, f"measured on this CPU now ({threads} threads, float32 matmul)")


def device_peak(gpu: str | None, precision: str, threads: int, cache_dir: Path) -> Peak | None:
    """The peak MFU is a share of: the GPU called ``gpu`` (as NVML names it) at the run's ``precision`` (the
    handoff's label) from the table, None for one the table lacks; with no GPU, this CPU's on ``threads`` threads
    (:func:`cpu_peak`, cached in ``cache_dir``)."""
    if gpu is not None:
        return gpu_peak(gpu, precision)
    import torch  # as in measure_cpu_flops: only for a CPU

    return cpu_peak(cache_dir, threads, torch.__version__)
