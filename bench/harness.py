"""``python -m bench.harness [job options]``: the per-rank program ``train.job``, unchanged, plus a probe.

The benchmark runs this under torchrun in place of ``train.job`` so that it needs no hook in ``train/``: it wraps
``train.job.build_trainer`` to add one callback, then runs ``train.job.main`` exactly as the job would. The probe
records when each optimizer step ends (wall clock, so the parent can subtract the time it started the process),
the logged losses, the real tokens per sample, the model's size and the peak memory, and rank 0 writes them as
JSON to the file named by ``BENCH_PROBE_FILE``. Without that variable it adds nothing.
"""

from __future__ import annotations

import time

STARTED = time.time()  # this rank's Python is up; what follows until IMPORTED is importing torch and transformers

import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

import train.job as job  # noqa: E402
from bench.stats import warmup_steps  # noqa: E402
from train.errors import run_main  # noqa: E402

IMPORTED = time.time()

PROBE_FILE_ENV = "BENCH_PROBE_FILE"


def _cuda_sync() -> None:
    # Step ends are seen by Python before the GPU finishes; a sync at the few steps that bound the timed window
    # makes the window exact without slowing every step.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def model_shape(model: Any) -> dict[str, Any]:
    """Parameters, layers, hidden size and vocabulary of a DistilBERT- or BERT-like model (for FLOPs per token)."""
    config = model.config
    return {
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "layers": int(getattr(config, "n_layers", None) or config.num_hidden_layers),
        "hidden": int(getattr(config, "dim", None) or config.hidden_size),
        "vocab_size": int(config.vocab_size),
        "model_type": str(config.model_type),
    }


class StepProbe(TrainerCallback):
    """Timestamps of optimizer steps and what the throughput and FLOPs figures need; written at train end."""

    def __init__(self, path: Path, facts: dict[str, Any], model: Any, settings: dict[str, Any]) -> None:
        self.path = path
        self.facts = facts
        self.shape = model_shape(model)
        self.settings = settings
        self.train_begin = 0.0
        self.step_ends: list[float] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.train_begin = time.time()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step in (1, warmup_steps(state.max_steps), state.max_steps):
            _cuda_sync()
        self.step_ends.append(time.time())

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        record = {
            "pid": os.getpid(),
            "python_started": STARTED,
            "imports_done": IMPORTED,
            "train_begin": self.train_begin,
            "step_ends": self.step_ends,
            "max_steps": state.max_steps,
            "samples_per_step": args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size,
            "real_tokens_per_sample": self.facts["train_real_tokens"] / max(self.facts["train_samples"], 1),
            "train_samples": self.facts["train_samples"],
            "losses": [[e["step"], e["loss"]] for e in state.log_history if "loss" in e],
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: KiB
            "cuda_peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
            "device_name": torch.cuda.get_device_name() if cuda else "cpu",
            "torch_threads": torch.get_num_threads(),
            **self.settings,
            **self.shape,
        }
        self.path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def install_probe(path: Path) -> None:
    """Wrap train.job.build_trainer so every Trainer it builds carries the probe."""
    build = job.build_trainer

    def build_with_probe(config: Any) -> Any:
        trainer, facts = build(config)
        settings = {
            "padding": config.job.padding,
            "max_seq_length": config.job.max_seq_length,
            "masked_only_head": config.job.masked_only_head,
            "mlm_probability": config.job.mlm_probability,
        }
        trainer.add_callback(StepProbe(path, facts, trainer.model, settings))
        return trainer, facts

    job.build_trainer = build_with_probe


if __name__ == "__main__":
    if os.environ.get(PROBE_FILE_ENV):
        install_probe(Path(os.environ[PROBE_FILE_ENV]))
    try:
        code = run_main(job.main)
    finally:
        job.cleanup()
    sys.exit(code)
