"""The spike rule (train/run/spikes.py) on loss series, and the divergence guard that asks it
(train/run/callbacks.py): when a spike stops the run, and when it is only said."""

from __future__ import annotations

import math
import random

import pytest
from transformers import TrainerControl, TrainerState

from train.config.resilience import ResilienceArguments
from train.run.callbacks import DivergenceGuard
from train.run.spikes import MIN_HISTORY, SpikeRule

THRESHOLD = ResilienceArguments().spike_threshold  # the default


def healthy(steps: int, seed: int = 0) -> list[dict[str, float]]:
    """A healthy run's logs: a loss falling from 9 toward 2 and a gradient norm rising through the warm-up then
    falling, each with 5 % multiplicative noise and an occasional 3x gradient-norm blip (as small batches show)."""
    rng = random.Random(seed)
    logs = []
    for step in range(steps):
        loss = 2 + 7 * math.exp(-step / 150)
        norm = (0.5 + 4 * min(step / 50, 1)) * math.exp(-step / 400) + 0.3
        blip = 3.0 if rng.random() < 0.02 else 1.0
        logs.append({"loss": loss * rng.gauss(1, 0.05), "grad_norm": norm * blip * abs(rng.gauss(1, 0.05))})
    return logs


@pytest.mark.parametrize("seed", range(5))
def test_a_healthy_series_noise_never_fires(seed: int) -> None:
    rule = SpikeRule(THRESHOLD)
    assert [i for i, logged in enumerate(healthy(1000, seed)) if rule.judge(logged)] == []


def test_a_spike_fires_and_is_kept_out_of_the_level() -> None:
    rule = SpikeRule(THRESHOLD)
    for logged in healthy(200):
        assert rule.judge(logged) is None
    kind, what = rule.judge({"loss": 9.0, "grad_norm": 1.0}) or ("", "")
    assert kind == "spike" and what.startswith("loss 9 is ") and "above its median" in what
    assert rule.judge({"loss": 9.0, "grad_norm": 1.0}) is not None  # judged against the level before it again
    kind, what = rule.judge({"loss": 3.0, "grad_norm": 40.0}) or ("", "")
    assert kind == "spike" and what.startswith("grad_norm 40 is ")


def test_a_non_finite_value_fires_at_once_even_without_history() -> None:
    rule = SpikeRule(THRESHOLD)
    assert rule.judge({"loss": 2.0, "grad_norm": math.nan}) == ("non-finite", "grad_norm is nan")
    assert rule.judge({"loss": math.inf}) == ("non-finite", "loss is inf")


def test_before_the_minimum_history_only_a_loss_far_above_its_highest_nor_a_fall_nor_with_threshold_0() -> None:
    rule = SpikeRule(THRESHOLD)
    assert rule.judge({"loss": 3102.0}) is None  # the first log: nothing to judge it by
    rule = SpikeRule(THRESHOLD)
    rule.judge({"loss": 8.21, "grad_norm": 0.86})
    for _ in range(MIN_HISTORY - 3):
        rule.judge({"loss": 2.0, "grad_norm": 0.86})
    assert rule.judge({"loss": 20.0, "grad_norm": 90.0}) is None  # 2.4x the highest loss; a norm too early
    assert rule.judge({"loss": 3102.0}) == ("spike", "loss 3102 is 155 times the highest of its 9 logs before")
    rule.judge({"loss": 2.0})
    assert rule.judge({"loss": 0.01}) is None  # a fall
    assert rule.judge({"loss": 50.0}) is not None
    off = SpikeRule(0.0)
    for _ in range(20):
        off.judge({"loss": 2.0})
    assert off.judge({"loss": 50.0}) is None


def test_a_flat_series_first_wobble_is_no_spike() -> None:
    rule = SpikeRule(THRESHOLD)
    for _ in range(20):
        rule.judge({"loss": 2.0})
    assert rule.judge({"loss": 2.1}) is None  # 5 %: the deviation's floor keeps it inside


def state(step: int) -> TrainerState:
    return TrainerState(global_step=step)


def test_the_guard_stops_on_a_spike_only_where_it_rolls_back() -> None:
    rolling, saying = DivergenceGuard(SpikeRule(THRESHOLD)), DivergenceGuard(SpikeRule(THRESHOLD), stop_on_spike=False)
    for guard in (rolling, saying):
        for step in range(1, 21):
            guard.on_log(None, state(step), TrainerControl(), logs={"loss": 2.0, "grad_norm": 1.0})
    stopped, said = TrainerControl(should_save=True), TrainerControl(should_save=True)
    rolling.on_log(None, state(21), stopped, logs={"loss": 20.0, "grad_norm": 1.0})
    saying.on_log(None, state(21), said, logs={"loss": 20.0, "grad_norm": 1.0})
    assert rolling.seen is not None and (rolling.seen.step, rolling.seen.kind, rolling.seen.healthy) == (
        21,
        "spike",
        20,
    )
    assert stopped.should_training_stop and not stopped.should_save
    assert saying.seen is None and not said.should_training_stop and said.should_save
    assert [s["step"] for s in saying.spikes_said] == [21]
    rolling.rearm()
    assert rolling.seen is None and rolling.rollbacks == 1


def test_the_guard_of_the_options() -> None:
    assert DivergenceGuard.of(ResilienceArguments(), "").stop_on_spike
    assert not DivergenceGuard.of(ResilienceArguments(spike_rollbacks=0), "").stop_on_spike
    unavailable = DivergenceGuard.of(ResilienceArguments(), "with a streamed corpus yet")
    assert not unavailable.stop_on_spike and unavailable.unavailable == "with a streamed corpus yet"


def test_a_run_that_learnt_its_data_does_not_spike_on_its_noise() -> None:
    """CI's Slurm budget test: a tiny model on 320 rows for hundreds of epochs logs a loss of 0.0003 and gradient
    norms of 0.0016 blipping to 0.02 and to 3.3 (past the clip), with no rise of the loss; harmless. A loss rise
    under MIN_LOSS_RISE is no spike, nor is a clipped run's gradient norm; an unclipped run's is."""
    rng = random.Random(1)
    rule, unclipped = SpikeRule(THRESHOLD, clipped=True), SpikeRule(THRESHOLD)
    for _ in range(60):
        logged = {"loss": 0.0003 * rng.uniform(0.8, 1.2), "grad_norm": 0.0016 * rng.uniform(0.8, 1.2)}
        assert rule.judge(logged) is None and unclipped.judge(logged) is None
    assert rule.judge({"loss": 0.0005, "grad_norm": 0.0234}) is None
    assert rule.judge({"loss": 0.004, "grad_norm": 3.3}) is None
    assert rule.judge({"loss": 0.4, "grad_norm": 0.0016}) is None  # 1,300 times the level, but 0.4 nats
    kind, what = rule.judge({"loss": 0.6, "grad_norm": 0.0016}) or ("", "")
    assert kind == "spike" and what.startswith("loss 0.6 is ")
    kind, what = unclipped.judge({"loss": 0.0003, "grad_norm": 3.3}) or ("", "")
    assert kind == "spike" and what.startswith("grad_norm 3.3 is ")
    assert rule.judge({"loss": 0.0003, "grad_norm": math.inf}) == ("non-finite", "grad_norm is inf")


def test_the_guard_judges_gradient_norms_only_without_clipping() -> None:
    assert DivergenceGuard.of(ResilienceArguments(), "", max_grad_norm=1.0).rule.clipped
    assert not DivergenceGuard.of(ResilienceArguments(), "", max_grad_norm=0.0).rule.clipped
