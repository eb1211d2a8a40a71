"""The probe the benchmark adds to a Trainer: when each optimizer step ends, and what the figures need.

Shared by bench.harness (our job, ``train.run.job``) and bench.run_mlm (transformers' run_mlm.py recipe), so both
recipes are timed by the same code. It records when each optimizer step ends (wall clock, so the parent can
subtract the time it started the process), the logged losses, the real tokens per sample, the model's size and
the peak memory; rank 0 writes them as JSON to the file named by ``BENCH_PROBE_FILE`` when training ends.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from bench.stats import warmup_steps
from train.borrowed.torch_dynamo import compile_counters

PROBE_FILE_ENV = "BENCH_PROBE_FILE"


def cuda_sync() -> None:
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


def dynamo_counters() -> dict[str, dict[str, int]] | None:
    """What torch.compile did in this process (frames compiled, graphs, recompiles); None when it never ran."""
    return compile_counters()


class StepProbe(TrainerCallback):
    """Timestamps of optimizer steps and what the throughput and FLOPs figures need; written at train end.

    ``facts`` needs ``train_real_tokens`` and ``train_samples``; ``settings`` names padding, max_seq_length,
    masked_only_head and mlm_probability; ``started``/``imported`` are when the rank's Python was up and when
    its imports were done (the entry module takes them, since only it knows).
    """

    def __init__(
        self,
        path: Path,
        facts: dict[str, Any],
        model: Any,
        settings: dict[str, Any],
        started: float,
        imported: float,
    ) -> None:
        self.path = path
        self.facts = facts
        self.shape = model_shape(model)
        self.settings = settings
        self.started = started
        self.imported = imported
        self.train_begin = 0.0
        self.step_ends: list[float] = []
        self.tokens_seen: list[int] = []  # the Trainer's real-token count at each step end (0s when it is off)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.train_begin = time.time()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step in (1, warmup_steps(state.max_steps), state.max_steps):
            cuda_sync()
        self.step_ends.append(time.time())
        self.tokens_seen.append(int(state.num_input_tokens_seen or 0))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        record = {
            "pid": os.getpid(),
            "python_started": self.started,
            "imports_done": self.imported,
            "train_begin": self.train_begin,
            "step_ends": self.step_ends,
            "tokens_seen": self.tokens_seen,
            "max_steps": state.max_steps,
            "samples_per_step": args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size,
            "real_tokens_per_sample": self.facts["train_real_tokens"] / max(self.facts["train_samples"], 1),
            "train_samples": self.facts["train_samples"],
            "losses": [[e["step"], e["loss"]] for e in state.log_history if "loss" in e],
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: KiB
            "cuda_peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
            "device_name": torch.cuda.get_device_name() if cuda else "cpu",
            "torch_threads": torch.get_num_threads(),
            "dynamo": dynamo_counters(),
            **self.settings,
            **self.shape,
        }
        self.path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
