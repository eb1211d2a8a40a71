"""bench/stats.py: throughput windows, time to the first step, memory, and the ratio statistics; no timing, made-up
records (tests/bench/records.py)."""

from __future__ import annotations

import pytest

from bench.flops import flops_per_token
from bench.stats import log_share, loss_agreement, paired_ratios, run_metrics, spread, warmup_steps
from tests.bench.records import probe


def test_warmup_is_a_fifth_and_at_least_one_step():
    assert [warmup_steps(n) for n in (2, 4, 5, 10, 400)] == [1, 1, 1, 2, 80]


def test_run_metrics_time_the_steady_steps():
    metrics = run_metrics(probe(), started=0.0, ended=42.0)
    assert metrics["timed_steps"] == 8
    assert metrics["samples_per_s"] == pytest.approx(8 * 32 / 9)
    assert metrics["real_tokens_per_s"] == pytest.approx(8 * 32 * 13 / 9)
    assert metrics["first_step_s"] == 10.0
    assert metrics["wall_s"] == 42.0
    assert metrics["peak_memory_bytes"] == 700 * 2**20
    assert metrics["final_loss"] == 10.2
    assert metrics["mfu"] is None  # no peak for a CPU


def test_real_tokens_are_the_trainers_count_over_the_window():
    # 100 real tokens a step for the warm-up steps, then 400: the window (steps 3..10, 9 s) saw 8 x 400
    counted = [100, 200] + [200 + 400 * k for k in range(1, 9)]
    metrics = run_metrics(probe(tokens_seen=counted), started=0.0, ended=42.0)
    assert metrics["real_tokens_per_s"] == pytest.approx(8 * 400 / 9)
    assert metrics["real_tokens_source"] == "counted by the Trainer"
    # counting off (all zeros) or an older record: the estimate from the average tokens per sample
    for record in (probe(tokens_seen=[0] * 10), probe()):
        metrics = run_metrics(record, started=0.0, ended=42.0)
        assert metrics["real_tokens_per_s"] == pytest.approx(8 * 32 * 13 / 9)
        assert metrics["real_tokens_source"] == "estimated per sample"


def test_startup_is_split_into_its_stages():
    record = probe(python_started=3.0, imports_done=7.0, train_begin=9.5)
    stages = run_metrics(record, started=0.0, ended=42.0)["startup_s"]
    assert stages == {"process": 3.0, "imports": 4.0, "setup": 2.5, "first_step": 0.5}
    assert sum(stages.values()) == run_metrics(record, started=0.0, ended=42.0)["first_step_s"]
    assert run_metrics(probe(), started=0.0, ended=42.0)["startup_s"] is None  # an older record without them


def test_run_metrics_on_a_gpu_report_cuda_memory_and_mfu():
    record = probe(cuda_peak_bytes=5 * 2**30, device_name="NVIDIA H200", padding="packed", masked_only_head=False)
    metrics = run_metrics(record, started=0.0, ended=42.0)
    assert metrics["peak_memory_bytes"] == 5 * 2**30
    expected = flops_per_token(4_416_442, 2, 128, 128) * metrics["real_tokens_per_s"] / 989.4e12
    assert metrics["mfu"] == pytest.approx(expected)


def test_a_run_with_one_step_cannot_be_timed():
    with pytest.raises(ValueError, match="too few"):
        run_metrics(probe(step_ends=[10.0]), started=0.0, ended=1.0)


def test_spread_and_paired_ratios():
    ratios = paired_ratios([10.0, 20.0, 30.0], [1.0, 2.0, 5.0])
    assert ratios == [10.0, 10.0, 6.0]
    assert spread(ratios) == {"min": 6.0, "median": 10.0, "max": 10.0}
    assert spread([3.0, 1.0, 2.0, 10.0])["median"] == 2.5
    with pytest.raises(ValueError, match="pairs"):
        paired_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        spread([])


def test_loss_agreement_pairs_the_same_steps():
    agreement = loss_agreement([[2, 10.0], [4, 9.0], [6, 8.0]], [[2, 10.5], [4, 9.0]])
    assert agreement["rows"] == [(2, 10.0, 10.5), (4, 9.0, 9.0)]
    assert agreement["max_abs_diff"] == pytest.approx(0.5)
    assert agreement["max_rel_diff"] == pytest.approx(0.05)


def test_log_share_splits_a_speed_up_into_its_factors():
    # 8x = 4x (the head) x 2x (the rest): the head makes two thirds of it on a log scale.
    assert log_share(4.0, 8.0) == pytest.approx(2 / 3)
    assert log_share(8.0, 8.0) == pytest.approx(1.0)
    assert log_share(1.5, 1.02) is None  # no speed-up to share
    assert log_share(0.0, 8.0) is None
