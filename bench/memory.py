"""The memory series (``--series memory``): what each rank holds under ``MLM_SHARDING=ddp`` and ``fsdp``, against
model size. Whole runs from ``./entrypoint.sh`` to exit on 2 ranks (gloo on CPU, one GPU a rank on GPUs), a BERT
built from its config at each size, a few steps on the demo samples; each run's run.json gives every rank's
measured parameters + gradients + AdamW state (summed from its local tensors at the first optimizer step) and its
peak memory while training (the resident set's high-water mark from the start of training to its end on CPU,
interpreter and libraries included; the CUDA allocator's peak on a GPU), the final model's consolidation after it
left out. The ratio fsdp / ddp per rank is the figure: about 1/2 of the state on 2 ranks, less of the peak, which
also holds what sharding leaves whole (activations, a layer's gathered weights, the libraries).

Results: ``bench/results/<date>-<host>-memory.json`` and ``.md``, and ``bench/results/latest-memory.md``, written
after every run, so a time limit keeps what was measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import report
from bench.runner import ROOT, RunFailed, child_env, fresh_run_dir, result_header, write_results

MODES = ("ddp", "fsdp")
# BERT shapes from the tiny to the base: (layers, hidden, heads); the feed-forward is 4 x hidden.
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "small": (4, 256, 4),
    "medium": (6, 512, 8),
    "base": (12, 768, 12),
}


@dataclass
class MemorySettings:
    device: str
    sizes: list[str] = field(default_factory=lambda: ["tiny", "small", "medium"])
    ranks: int = 2
    max_steps: int = 5
    batch_size: int = 8
    vocab_size: int = 8000
    threads: int | None = None


def default_memory_settings(device: str) -> MemorySettings:
    """Three sizes on CPU (about 4 minutes on 2 cores); up to bert-base on GPUs."""
    if device == "cuda":
        return MemorySettings(device, sizes=["small", "medium", "base"], max_steps=20, batch_size=32)
    return MemorySettings(device)


def check(settings: MemorySettings) -> None:
    unknown = [s for s in settings.sizes if s not in SIZES]
    if unknown:
        raise ValueError(f"unknown memory series size(s) {', '.join(unknown)}; expected {', '.join(SIZES)}")
    if settings.ranks < 1:
        raise ValueError("the memory series needs 1 or more ranks (2 or more to shard anything)")


def overrides(size: str) -> str:
    layers, hidden, heads = SIZES[size]
    return f"num_hidden_layers={layers},hidden_size={hidden},num_attention_heads={heads},intermediate_size={4 * hidden}"


def run_env(settings: MemorySettings, size: str, mode: str, output: Path, workdir: Path) -> dict[str, str]:
    env = child_env(workdir, settings.threads)
    env.update(
        MLM_CONFIG=str(ROOT / "configs" / "demo.yaml"), MLM_MODEL_NAME_OR_PATH="scratch:bert",
        MLM_CONFIG_OVERRIDES=overrides(size), MLM_TOKENIZER_VOCAB_SIZE=str(settings.vocab_size),
        MLM_SHARDING=mode, MLM_NPROC_PER_NODE=str(settings.ranks), MLM_MAX_STEPS=str(settings.max_steps),
        MLM_PER_DEVICE_TRAIN_BATCH_SIZE=str(settings.batch_size), MLM_SAVE_STRATEGY="no", MLM_EVAL_STRATEGY="no",
        MLM_DATALOADER_NUM_WORKERS="0", MLM_OUTPUT_DIR=str(output), MLM_LOG_FORMAT="json",
    )  # fmt: skip
    if os.environ.get("MLM_PYTHON"):  # the interpreter ./entrypoint.sh runs (bench/gpu.sh sets it), not an option
        env["MLM_PYTHON"] = os.environ["MLM_PYTHON"]
    return env


def run_one(settings: MemorySettings, size: str, mode: str, workdir: Path) -> dict[str, Any]:
    """One whole run of ``size`` under ``mode``; what its run.json says of each rank's memory."""
    directory = fresh_run_dir(workdir, f"memory-{size}-{mode}")
    directory.mkdir(parents=True)
    output = directory / "output"
    with open(directory / "log.txt", "w", encoding="utf-8") as log:
        started = time.monotonic()
        code = subprocess.call(
            [str(ROOT / "entrypoint.sh")], cwd=ROOT, env=run_env(settings, size, mode, output, workdir), stdout=log,
            stderr=log,
        )  # fmt: skip
        seconds = time.monotonic() - started
    if code != 0:
        raise RunFailed(f"memory {size} {mode} exited {code}; see {directory / 'log.txt'}")
    sharding = json.loads((output / "run.json").read_text(encoding="utf-8"))["sharding"]
    states = [sum(rank.values()) for rank in sharding["state_bytes_per_rank"]]
    return {
        "size": size, "mode": mode, "seconds": round(seconds, 1), "parameters": sharding["ddp_estimate"]["parameters"],
        "state_bytes_per_rank": states, "state_detail_per_rank": sharding["state_bytes_per_rank"],
        "peak_bytes_per_rank": sharding["training_peak_bytes_per_rank"], "choice": sharding.get("choice"),
        "setup_bytes_per_rank": sharding.get("setup_bytes_per_rank"),
    }  # fmt: skip


def run_memory_series(settings: MemorySettings, workdir: Path, results_dir: Path, stem: str, tagged: bool) -> None:
    """Each size under ddp then fsdp; the results written after every run, the report printed at the end."""
    check(settings)
    report.progress(
        f"bench memory: {settings.device}, {settings.ranks} ranks, sizes {'/'.join(settings.sizes)}, "
        f"{settings.max_steps} steps of {settings.batch_size} per rank; in {workdir}"
    )
    result: dict[str, Any] = {**result_header(asdict(settings)), "runs": [], "failures": []}
    markdown = ""
    for size in settings.sizes:
        for mode in MODES:
            try:
                run = run_one(settings, size, mode, workdir)
            except RunFailed as exc:
                result["failures"].append(str(exc))
                report.progress(str(exc))
                continue
            result["runs"].append(run)
            report.progress(f"memory {size} {mode}: state {mib(max(run['state_bytes_per_rank']))} a rank")
            markdown = memory_report(result)
            write_results(results_dir, f"{stem}-memory", result, markdown, None if tagged else "latest-memory.md")
    print(markdown)


def mib(size: float) -> str:
    return f"{size / 2**20:,.1f} MiB"


def memory_report(result: dict[str, Any]) -> str:
    """The series as a Markdown table: per size, each mode's largest rank, and fsdp's share of ddp's."""
    settings = result["settings"]
    lines = [
        f"# Memory per rank, ddp against fsdp ({result['date']}, {settings['device']}, {settings['ranks']} ranks)",
        "",
        f"BERT built from its config at each size, {settings['max_steps']} steps of {settings['batch_size']} x 128 "
        "tokens a rank, through ./entrypoint.sh (bench/memory.py). State: parameters + gradients + AdamW state, "
        "measured from each rank's local tensors. Peak, from the start of training to its end: "
        + ("the CUDA allocator's peak." if settings["device"] == "cuda" else "the process's peak resident set "
           "(interpreter and libraries included)."),
        *(["", "On 1 rank fsdp shards nothing: the figures check its code path, not the saving."]
          if settings["ranks"] < 2 else []),
        "",
        "Setup: a rank's growth in resident memory while its model was built (or loaded) and sharded; under fsdp "
        "rank 0 builds the whole model and the others only their shards (train/run/model_setup.py).",
        "",
        "| size | parameters | ddp state | fsdp state | fsdp / ddp | ddp peak | fsdp peak | fsdp / ddp | ddp setup "
        "| fsdp setup, rank 0 / others |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    by = {(r["size"], r["mode"]): r for r in result["runs"]}
    for size in settings["sizes"]:
        ddp, fsdp = by.get((size, "ddp")), by.get((size, "fsdp"))
        if ddp is None or fsdp is None:
            continue
        state = max(ddp["state_bytes_per_rank"]), max(fsdp["state_bytes_per_rank"])
        peak = max(ddp["peak_bytes_per_rank"]), max(fsdp["peak_bytes_per_rank"])
        lines.append(
            f"| {size} | {ddp['parameters'] or 0:,} | {mib(state[0])} | {mib(state[1])} | {state[1] / state[0]:.2f} "
            f"| {mib(peak[0])} | {mib(peak[1])} | {peak[1] / peak[0]:.2f} | {_setup(ddp)} "
            f"| {_setup(fsdp, 0)} / {_setup(fsdp, 1)} |"
        )
    for failure in result["failures"]:
        lines.append(f"\nFailed: {failure}")
    return "\n".join(lines) + "\n"


def _setup(run: dict[str, Any], ranks_from: int | None = None) -> str:
    """The largest setup growth of the run's ranks (all of them, rank 0 alone with 0, the others with 1)."""
    setup = run.get("setup_bytes_per_rank") or []
    chosen = setup if ranks_from is None else setup[:1] if ranks_from == 0 else setup[1:]
    known = [grown for grown in chosen if grown is not None]
    return mib(max(known)) if known else "-"
