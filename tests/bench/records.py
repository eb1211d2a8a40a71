"""Made-up records of benchmark runs, shared by the tests of the figures, the summaries and the reports."""

from __future__ import annotations

from typing import Any

from bench.stats import run_metrics


def probe(**overrides: Any) -> dict[str, Any]:
    """bench/probe.py's record of a 10-step CPU run of the small model."""
    record = {
        # ten steps; the first two (a fifth) are warm-up, so the window is steps 3..10: 8 steps in 20 - 11 = 9 s
        "step_ends": [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0, 18.0, 20.0],
        "samples_per_step": 32,
        "real_tokens_per_sample": 13.0,
        "losses": [[2, 10.4], [4, 10.2]],
        "peak_rss_bytes": 700 * 2**20,
        "cuda_peak_bytes": None,
        "device_name": "cpu",
        "torch_threads": 1,
        "padding": "dynamic",
        "max_seq_length": 128,
        "masked_only_head": True,
        "mlm_probability": 0.15,
        "parameters": 4_416_442,
        "layers": 2,
        "hidden": 128,
        "vocab_size": 30522,
    }
    record.update(overrides)
    return record


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def real_run(model: str, rep: int, recipe: str, tokens_per_s: float, loss: float = 10.0) -> dict[str, Any]:
    """One run of the real series as bench/real_series.py records it."""
    metrics = run_metrics(probe(), started=0.0, ended=42.0)
    return {
        **metrics, "real_tokens_per_s": tokens_per_s, "final_loss": loss, "model": model, "rep": rep,
        "recipe": recipe, "label": f"real-{model}-{rep}-{recipe}", "load_avg_1m": [1.0, 2.0], "probe": probe(),
    }  # fmt: skip


RUNS = [
    real_run("tiny", 1, "ours", 800.0),
    real_run("tiny", 1, "ours-dense", 200.0),
    real_run("tiny", 1, "run_mlm", 100.0),
    real_run("tiny", 2, "ours", 900.0),
    real_run("tiny", 2, "ours-dense", 300.0),
    real_run("tiny", 2, "run_mlm", 150.0),
    real_run("tiny", 3, "ours", 1000.0),  # an unfinished pair: its ratios are left out, not paired across pairs
]
