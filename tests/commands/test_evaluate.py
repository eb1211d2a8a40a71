"""What `evaluate` says it scored (train/commands/evaluate.py): the data named in its line and eval_results.json,
the demo's sentences said to be only that when no data is named (a model's run.json is never followed)."""

from __future__ import annotations

from train.commands.evaluate import results_text, scored_data
from train.config import load_config


def test_the_data_scored_is_named_whichever_option_named_it() -> None:
    unset = load_config([], {})
    assert scored_data(unset.data) == "the built-in demo sentences (MLM_DATASET is not set: name the data to score)"
    named = load_config([], {"MLM_DATASET": "/data/legal.txt"})
    assert scored_data(named.data) == "/data/legal.txt (MLM_DATASET, its held-out part)"
    demo_asked = load_config(["--dataset", "demo"], {})
    assert scored_data(demo_asked.data).startswith("demo (")
    held = load_config([], {"MLM_DATASET": "/data/legal.txt", "MLM_VALIDATION_FILE": "/data/held.txt"})
    assert scored_data(held.data) == "/data/held.txt (MLM_VALIDATION_FILE)"


def test_the_line_names_the_data() -> None:
    results = {"model": "out/final", "eval_samples": 1200, "data": "/data/held.txt (MLM_VALIDATION_FILE)",
               "eval_loss": 2.5, "perplexity": 12.18, "eval_accuracy": None}  # fmt: skip
    assert results_text(results) == (
        "evaluated out/final on 1,200 held-out samples of /data/held.txt (MLM_VALIDATION_FILE): loss 2.5000, "
        "perplexity 12.18"
    )
