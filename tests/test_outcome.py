"""What a run amounts to: the final evaluation reused or run, real tokens per second, perplexity, the divergence
line and all_results.json's contents."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from train.run.outcome import (
    divergence_message,
    evaluation_at,
    final_metrics,
    perplexity,
    real_tokens_per_second,
    session_rates,
)


@dataclass
class Counts:
    streaming: bool = False
    train_samples: int | None = 100
    train_real_tokens: int | None = 1500
    eval_samples: int = 10


def test_the_evaluation_at_the_last_step_is_reused() -> None:
    history = [
        {"loss": 3.0, "step": 10},
        {"eval_loss": 2.0, "eval_accuracy": 0.5, "step": 20},
        {"loss": 1.9, "step": 20},
    ]
    assert evaluation_at(history, 20) == {"eval_loss": 2.0, "eval_accuracy": 0.5}


@pytest.mark.parametrize(
    "history",
    [
        [],
        [{"loss": 3.0, "step": 20}],
        [{"eval_loss": 2.0, "step": 10}, {"loss": 1.0, "step": 20}],  # the newest evaluation is older
        [{"eval_loss": 2.0, "step": 20}, {"eval_loss": 1.5, "step": 15}],  # only the newest one counts
    ],
)
def test_otherwise_the_final_weights_are_evaluated(history: list[dict]) -> None:
    assert evaluation_at(history, 20) is None


def test_real_tokens_per_second_counted_estimated_or_unknown() -> None:
    assert real_tokens_per_second(1000, 4.0, 99.0, 7.0) == 250.0  # counted wins
    assert real_tokens_per_second(1000, 0.0, 99.0, 7.0) == 0.0
    assert real_tokens_per_second(0, 4.0, 10.0, 15.0) == 150.0  # counting off: samples/s x tokens per sample
    assert real_tokens_per_second(0, 4.0, 10.0, None) is None


def test_perplexity_overflows_to_infinity() -> None:
    assert perplexity(0.0) == 1.0 and perplexity(2.0) == pytest.approx(math.e**2)
    assert perplexity(800.0) == math.inf


def test_the_divergence_line_names_step_cause_what_is_kept_and_the_fix() -> None:
    line = divergence_message(12, "loss is nan", "checkpoint-10", 0.05)
    assert "diverged at step 12 (loss is nan)" in line and "checkpoint-10, is kept" in line
    assert "learning_rate (now 0.05)" in line and "MLM_RESUME=never" in line
    assert "no checkpoint was saved" in divergence_message(3, "x", None, 1e-4)


def test_final_metrics_from_the_trainers_count() -> None:
    metrics = {"train_runtime": 2.0, "train_samples_per_second": 50.0, "eval_loss": 1.0}
    out = final_metrics(metrics, tokens_this_session=600, tokens_in_all=900, corpus=Counts(), world_size=2)
    assert out["train_tokens_per_second"] == 300.0 and out["num_input_tokens_seen"] == 900
    assert out["perplexity"] == pytest.approx(math.e)
    assert (out["world_size"], out["train_samples"], out["eval_samples"]) == (2, 100, 10)
    # A time budget's final evaluation read 4 of the 10 held-out examples: its loss is theirs, and says so.
    sampled = final_metrics({**metrics, "eval_samples": 4}, tokens_this_session=600, tokens_in_all=900,
                            corpus=Counts(), world_size=2)  # fmt: skip
    assert sampled["eval_samples"] == 4


def test_final_metrics_without_a_count_estimate_from_samples() -> None:
    metrics = {"train_runtime": 2.0, "train_samples_per_second": 50.0}
    out = final_metrics(metrics, tokens_this_session=0, tokens_in_all=0, corpus=Counts(), world_size=1)
    assert out["train_tokens_per_second"] == 50.0 * 15 and "num_input_tokens_seen" not in out
    assert "perplexity" not in out


def test_a_stream_without_a_count_says_zero_not_a_guess() -> None:
    stream = Counts(streaming=True, train_samples=None, train_real_tokens=None)
    out = final_metrics({"train_runtime": 1.0}, tokens_this_session=0, tokens_in_all=0, corpus=stream, world_size=1)
    assert out["train_tokens_per_second"] == 0.0 and out["num_input_tokens_seen"] == 0 and out["train_samples"] is None


def test_the_rates_are_of_the_steps_this_session_ran_not_of_the_trainers_plan() -> None:
    """A budgeted run that planned 40,000 samples and trained 332 steps of 16 rows in 73 s: 72.8 rows/s, not the
    Trainer's 40,000 / 73 s; a batch warm-up's steps count their share of the full batch."""
    planned = {"train_runtime": 73.0, "train_samples_per_second": 547.9, "train_steps_per_second": 34.2}
    rates = session_rates(planned, full_steps=332, steps=332, global_batch=16)
    assert rates == {"train_samples_per_second": 72.767, "train_steps_per_second": 4.548}
    ramp = session_rates(planned, full_steps=200.5, steps=332, global_batch=16)
    assert ramp["train_samples_per_second"] == round(200.5 * 16 / 73.0, 3)
    assert session_rates({"train_runtime": 0.0}, full_steps=1, steps=1, global_batch=16) == {}  # nothing timed
    assert session_rates(planned, full_steps=0, steps=0, global_batch=16) == {}  # a resume at its last step
