"""The straggler rule (train/common/stragglers.py) and its measure on a rank (train/run/stragglers.py): which rank
is slow in a record, named after SLOW_RECORDS in a row once, said in words for the report and the trackers; the
forward passes timed in training only."""

from __future__ import annotations

import time

import torch

from train.common.stragglers import SLOW_RATIO, SLOW_RECORDS, Straggler, slow_ranks, straggler_words
from train.run.stragglers import ForwardClock, Stragglers


def test_a_rank_is_slow_at_the_ratio_to_the_others_median() -> None:
    assert slow_ranks([0.1, 0.1, 0.1, 0.1]) == {}
    assert slow_ranks([0.1, 0.1, 0.1, 0.1 * SLOW_RATIO]) == {3: (SLOW_RATIO, 0.1)}
    assert slow_ranks([0.1, 0.1, 0.1, 0.1 * SLOW_RATIO * 0.99]) == {}
    assert slow_ranks([0.1, 0.3]) == {1: (3.0, 0.1)}  # two ranks: the other alone is the median
    assert slow_ranks([0.0, 0.0]) == {} and slow_ranks([0.2]) == {}


def test_a_rank_is_named_once_after_enough_slow_records_in_a_row(monkeypatch) -> None:
    said: list[str] = []
    monkeypatch.setattr("train.run.stragglers.warn", said.append)
    stragglers = Stragglers(torch.nn.Linear(2, 2))
    healthy, slow = [0.1, 0.1, 0.1], [0.1, 0.1, 0.4]
    for step, seconds in enumerate([slow, slow, healthy, *[slow] * (SLOW_RECORDS - 1)], start=1):
        stragglers.watch(step, seconds)  # a streak broken by a healthy record starts again
    assert stragglers.named == [] and said == []
    for step in range(10, 13):
        stragglers.watch(step, slow)
    assert stragglers.named == [Straggler(2, 10, 4.0, 0.4, 0.1)]  # named once, at the record that made it
    (line,) = said
    assert line.startswith("straggler: rank 2 spent 4.0x the others' median on its own work per step")
    assert "0.400 s against 0.100 s" in line and f"over the last {SLOW_RECORDS} records, up to step 10" in line
    assert stragglers.record() is None  # no process group here: one rank, nothing compared


def test_run_jsons_record_in_words_read_as_data() -> None:
    named = Straggler(1, 40, 3.02, 0.3, 0.1).record()
    assert straggler_words([named]) == "rank 1 (from step 40: 3.0x the others' median)"
    assert straggler_words([]) == "none"
    assert straggler_words(None) is None  # one rank: nothing was compared
    assert straggler_words([{"rank": "x"}, 7]) == "none"  # what does not read as one is left out


def test_the_forward_passes_are_timed_in_training_only() -> None:
    model = torch.nn.Linear(2, 2)
    clock = ForwardClock(model)
    model.register_forward_pre_hook(lambda module, inputs: time.sleep(0.05))  # after the clock's: inside its window
    model(torch.ones(2))
    model.eval()
    model(torch.ones(2))  # an evaluation's: not a training step's
    assert 0.05 <= clock.take() < 0.1
    assert clock.take() == 0.0
