"""Pure functions from what a run recorded to the figures the benchmark reports (tested in
tests/bench/test_stats.py)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from bench.flops import flops_per_token, mfu, peak_flops

# The figures of a run (run_metrics) that both series summarise per recipe, min / median / max.
METRICS = ("real_tokens_per_s", "samples_per_s", "wall_s", "first_step_s", "peak_memory_bytes")


def warmup_steps(max_steps: int) -> int:
    """Steps left out of the throughput window: the first fifth, at least one (the dataloader workers start,
    memory is first allocated, kernels are chosen). bench.harness synchronises the GPU at the window's ends."""
    return max(1, max_steps // 5)


def run_metrics(probe: dict[str, Any], started: float, ended: float) -> dict[str, Any]:
    """Throughput over the steady steps, wall time, time to the first step and peak memory of one run.

    ``started``/``ended`` are the parent's wall-clock times around the process; ``probe`` is bench.harness's record.
    Samples/s = steps in the window x samples per step / the window's seconds. Real tokens/s = the real
    (non-padding) tokens the Trainer counted in the window (``include_num_input_tokens_seen="non_padding"``, every
    recipe) / its seconds; a record without the count falls back to samples/s x the average real tokens per sample.
    """
    ends = probe["step_ends"]
    if not ends:
        raise ValueError("the run recorded no optimizer step")
    if len(ends) < 2:
        raise ValueError(f"{len(ends)} step: too few to time (need at least 2)")
    warmup = warmup_steps(len(ends))
    steps = len(ends) - warmup
    window = ends[-1] - ends[warmup - 1]
    samples_per_s = steps * probe["samples_per_step"] / window if window > 0 else 0.0
    counted = probe.get("tokens_seen") or []
    if len(counted) == len(ends) and counted[-1] > counted[warmup - 1]:
        real_tokens_per_s, tokens_source = (counted[-1] - counted[warmup - 1]) / window, "counted by the Trainer"
    else:
        real_tokens_per_s, tokens_source = samples_per_s * probe["real_tokens_per_sample"], "estimated per sample"
    peak = probe.get("cuda_peak_bytes") or probe["peak_rss_bytes"]
    metrics: dict[str, Any] = {
        "wall_s": ended - started,
        "first_step_s": ends[0] - started,
        "samples_per_s": samples_per_s,
        "real_tokens_per_s": real_tokens_per_s,
        "real_tokens_source": tokens_source,
        "peak_memory_bytes": peak,
        "peak_memory_kind": "cuda max_memory_allocated" if probe.get("cuda_peak_bytes") else "process RSS",
        "timed_steps": steps,
        # Where the time to the first step goes: torchrun and the rank's Python starting, importing torch,
        # transformers and datasets, then data + model + Trainer, then the first step (dataloader workers start).
        "startup_s": {
            "process": probe["python_started"] - started,
            "imports": probe["imports_done"] - probe["python_started"],
            "setup": probe["train_begin"] - probe["imports_done"],
            "first_step": ends[0] - probe["train_begin"],
        }
        if "python_started" in probe
        else None,
        "final_loss": probe["losses"][-1][1] if probe["losses"] else None,
    }
    model_flops = run_flops_per_token(probe)
    metrics["flops_per_token"] = model_flops
    device_peak = peak_flops(probe.get("device_name", "cpu"))
    metrics["mfu"] = mfu(model_flops, real_tokens_per_s, device_peak) if device_peak else None
    return metrics


def run_flops_per_token(probe: dict[str, Any]) -> float:
    """bench.flops' formula with the run's model and sequence length (see that module for the derivation)."""
    packed = probe.get("padding") == "packed"
    seq_len = probe["max_seq_length"] if packed else probe["real_tokens_per_sample"]
    head_fraction = probe["mlm_probability"] if probe.get("masked_only_head") else 1.0
    return flops_per_token(
        probe["parameters"], probe["layers"], probe["hidden"], seq_len, probe["vocab_size"], head_fraction
    )


def spread(values: Sequence[float]) -> dict[str, float]:
    """min / median / max of a non-empty sequence."""
    if not values:
        raise ValueError("no values")
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def paired_ratios(ours: Sequence[float], seed: Sequence[float]) -> list[float]:
    """ours[i] / seed[i] for each repetition i: runs i of both recipes ran back to back, so noise hits both."""
    if len(ours) != len(seed):
        raise ValueError(f"{len(ours)} runs of ours against {len(seed)} of the seed: expected pairs")
    return [o / s for o, s in zip(ours, seed, strict=True) if s > 0]


def log_share(part: float, whole: float, floor: float = 1.05) -> float | None:
    """The share of a speed-up ``whole`` that a factor ``part`` of it makes, on a log scale: ``whole`` = ``part``
    x the rest, so the share is log(part) / log(whole). None when ``whole`` is within ``floor`` of 1 either way
    (no speed-up to share), or a ratio is not positive."""
    if part <= 0 or whole <= 0 or abs(math.log(whole)) < math.log(floor):
        return None
    return math.log(part) / math.log(whole)


def loss_agreement(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Side-by-side losses at the steps both logged, and the largest absolute and relative difference."""
    losses_b = {int(step): loss for step, loss in b}
    rows = [(int(step), loss, losses_b[int(step)]) for step, loss in a if int(step) in losses_b]
    if not rows:
        return {"rows": [], "max_abs_diff": None, "max_rel_diff": None}
    return {
        "rows": rows,
        "max_abs_diff": max(abs(x - y) for _, x, y in rows),
        "max_rel_diff": max(abs(x - y) / max(abs(x), 1e-12) for _, x, y in rows),
    }
