"""``python -m bench.harness [job options]``: the per-rank program ``train.run.job``, unchanged, plus a probe.

The benchmark runs this under torchrun in place of ``train.run.job`` so that it needs no hook in ``train/``: it wraps
``train.run.job.prepare`` to add one callback (bench/probe.py's StepProbe), then runs ``train.run.job.main`` exactly
as the job would. Rank 0 writes the probe's record as JSON to the file named by ``BENCH_PROBE_FILE``; without that
variable it adds nothing.
"""

from __future__ import annotations

import time

STARTED = time.time()  # this rank's Python is up; what follows until IMPORTED is importing torch and transformers

import os  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import train.run.job as job  # noqa: E402
from bench.probe import PROBE_FILE_ENV, StepProbe  # noqa: E402
from train.common.distributed import run_and_exit  # noqa: E402

IMPORTED = time.time()


def install_probe(path: Path) -> None:
    """Wrap train.run.job.prepare so every Trainer it builds carries the probe."""
    prepare = job.prepare

    def prepare_with_probe(config: Any, *args: Any) -> Any:
        prepared = prepare(config, *args)
        settings = {
            "padding": config.data.padding,
            "max_seq_length": config.data.max_seq_length,
            "masked_only_head": prepared.head == "masked-only",  # the head that ran, not the one asked for
            "mlm_probability": config.masking.mlm_probability,
        }
        trainer, facts = prepared.trainer, prepared.facts()
        counted = {"train_samples": facts.train_samples, "train_real_tokens": facts.train_real_tokens}
        trainer.add_callback(StepProbe(path, counted, trainer.model, settings, STARTED, IMPORTED))
        return prepared

    job.prepare = prepare_with_probe


if __name__ == "__main__":
    if os.environ.get(PROBE_FILE_ENV):
        install_probe(Path(os.environ[PROBE_FILE_ENV]))
    run_and_exit(job.main)  # as train.run.job exits
