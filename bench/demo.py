"""The demo series of ``make bench``: the seed recipe against our default recipe, same model, same data.

Each repetition runs the seed preset (configs/seed.yaml) and then our default recipe (no preset: the schema's
defaults plus the changes proposed in PROPOSED_DEFAULTS), each in a fresh ``torchrun`` process, alternating
A B A B so that load from other work on the machine hits both alike. Both train the same model from scratch
(on CPU a 2-layer DistilBERT with the real 30,522-token vocabulary; on a GPU the full-size DistilBERT) with the
same tokenizer on the same data (the seed's 50,000 demo samples) for the same number of steps.

Per run: real (non-padding) tokens/s and samples/s over the steady steps, wall time, time from process start to
the first optimizer step, peak memory (RSS on CPU, ``torch.cuda.max_memory_allocated`` on GPU), the loss curve,
and on a GPU the MFU (bench/flops.py). Then the ratios ours/seed per repetition with min/median/max, the two
loss curves side by side, and the tokenization time of the 50,000 samples cold and from the cache. Then the
start-up figures (bench/startup.py): importing the job and the launcher, and whole warm 2-step demo runs, against
a bare ``import torch, transformers, datasets`` measured alongside.

This module is the pure part (tested in tests/bench/test_demo.py), as bench/real.py is the real series': the
settings, the recipes and their flags, the run order, and the summary of the runs; bench/demo_series.py prepares
the data and runs them, bench/report.py renders the summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.launcher import padding_flags, precision_flags
from bench.stats import METRICS, loss_agreement, paired_ratios, spread

SEED_PRESET = "configs/seed.yaml"
DEMO_PRESET = "configs/demo.yaml"

# What our defaults should be (proposed for train/config.py); the "ours" recipe passes them explicitly so the
# benchmark measures the proposal today and keeps measuring the same thing once they are the defaults.
PROPOSED_DEFAULTS: dict[str, str] = {"masked_only_head": "true"}

# The model both recipes train. scratch: because the hub is unreachable here and on the GPU machine; the real
# vocabulary size because the vocabulary projection is most of a small model's work.
SMALL_MODEL = "n_layers=2,dim=128,hidden_dim=512,n_heads=2,vocab_size=30522"
FULL_MODEL = "vocab_size=30522"  # DistilBERT's own sizes: 6 layers, dim 768, 66 M parameters


@dataclass
class DemoSettings:
    device: str
    model_overrides: str
    repeats: int
    max_steps: int
    logging_steps: int
    eval_samples: int
    recipes: list[str]
    extras: list[str] = field(default_factory=list)
    packed_batch_size: int = 256
    extra_steps: int = 150
    threads: int | None = None  # OMP_NUM_THREADS of each run; None: as the launcher sets it (cores / processes)


def default_settings(device: str) -> DemoSettings:
    if device == "cuda":
        return DemoSettings("cuda", FULL_MODEL, repeats=2, max_steps=400, logging_steps=20, eval_samples=2048,
                            recipes=["seed", "ours"], extras=["packed", "ours-batch256", "packed-compile"])  # fmt: skip
    # A seed step of the small model takes seconds on a CPU (it projects 128 positions x 32 samples onto the
    # 30,522-token vocabulary), so a few steps per run keep `make bench` to minutes. One thread per run: on a
    # host shared with other work, OpenMP threads wait at every barrier for a descheduled sibling, which
    # multiplies the time of small operations (ours) far more than of large ones (the seed's) and turns the
    # figures into scheduler noise; --threads 0 measures with the launcher's setting instead.
    return DemoSettings("cpu", SMALL_MODEL, repeats=3, max_steps=10, logging_steps=2, eval_samples=64,
                        recipes=["seed", "ours"], threads=1)  # fmt: skip


def recipe_flags(name: str, settings: DemoSettings) -> list[str]:
    """The options that make a recipe; everything else is common to all runs (common_flags)."""
    gpu = settings.device == "cuda"
    # What the launcher hands the ranks (bench/launcher.py): the seed preset keeps its fp16 on CUDA and loses it
    # on CPU; our default gets bf16 + tf32 on a GPU, and on a CPU padding to the longest sample.
    launcher = precision_flags(settings.device) + padding_flags(settings.device)
    proposed = [arg for key, value in PROPOSED_DEFAULTS.items() for arg in (f"--{key}", value)]
    if name == "seed":
        return ["--config", SEED_PRESET] + ([] if gpu else ["--fp16", "false"])
    if name == "ours":
        return proposed + launcher
    if name == "current":  # the defaults as train/config.py has them now, without the proposals
        return launcher
    if name == "packed":  # one packed-128 run for MFU: full blocks, a batch large enough to fill the GPU
        return proposed + launcher + [
            "--padding", "packed", "--per_device_train_batch_size", str(settings.packed_batch_size),
            "--eval_strategy", "no", "--save_strategy", "no", "--dataloader_persistent_workers", "true",
        ]  # fmt: skip
    if name == "ours-batch256":  # throughput of our recipe with a batch that fills a GPU (a recipe change)
        return proposed + launcher + ["--per_device_train_batch_size", str(settings.packed_batch_size)]
    if name == "packed-compile":
        return recipe_flags("packed", settings) + ["--torch_compile", "true"]
    raise ValueError(f"unknown recipe {name!r}")


def common_flags(settings: DemoSettings, tokenizer_dir: Path, steps: int) -> list[str]:
    """The options every run of the series gets: the model, the tokenizer, the demo data, steps and evaluation."""
    # --recipe classic: the seed's model is a pretrained DistilBERT, whose runs get the classic recipe; the
    # scratch model standing in for it (the hub is unreachable) must not get a scratch model's modern one.
    return [
        "--model_name_or_path", "scratch:distilbert", "--recipe", "classic", "--config_overrides",
        settings.model_overrides, "--tokenizer_name", str(tokenizer_dir), "--dataset", "demo",
        "--demo_samples", "50000",
        "--max_steps", str(steps), "--logging_steps", str(settings.logging_steps),
        "--max_eval_samples", str(settings.eval_samples), "--seed", "42", "--report_to", "none",
    ]  # fmt: skip


def schedule(settings: DemoSettings) -> list[tuple[int, str]]:
    """(repetition, recipe) in run order: A B A B ..., so a burst of load elsewhere hits both recipes of a pair."""
    return [(rep, name) for rep in range(1, settings.repeats + 1) for name in settings.recipes]


def summarise(runs: list[dict[str, Any]], settings: DemoSettings) -> dict[str, Any]:
    """Each recipe's figures (min / median / max), each recipe's ratios to the seed per repetition, and the loss
    curves of the first seed and ours runs side by side."""
    by_recipe = {name: [r for r in runs if r["recipe"] == name] for name in dict.fromkeys(r["recipe"] for r in runs)}
    summary: dict[str, Any] = {
        name: {m: spread([r[m] for r in rs]) for m in METRICS} for name, rs in by_recipe.items() if rs
    }
    for name, rs in by_recipe.items():
        if rs and rs[0]["mfu"] is not None:
            summary[name]["mfu"] = spread([r["mfu"] for r in rs])
    ratios: dict[str, Any] = {}
    seed = by_recipe.get("seed", [])
    for name in settings.recipes:
        if name == "seed" or not by_recipe.get(name) or not seed:
            continue
        ratios[name] = {}
        for metric in METRICS:
            values = paired_ratios([r[metric] for r in by_recipe[name]], [r[metric] for r in seed])
            ratios[name][metric] = {**spread(values), "values": values}
    curves = {}
    if seed and by_recipe.get("ours"):
        curves = loss_agreement(seed[0]["losses"], by_recipe["ours"][0]["losses"])
    return {"summary": summary, "ratios": ratios, "loss_curves": curves}
