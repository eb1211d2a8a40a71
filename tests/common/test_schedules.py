"""The batch warm-up's rule (train/common/schedules.py BatchWarmup): the rows of each step, their shares, and what a
plan of steps costs in full steps."""

from __future__ import annotations

import pytest

from train.common.schedules import BatchWarmup, full_steps_between


def test_the_batch_grows_linearly_in_whole_units_to_its_full_size_at_the_ramps_end() -> None:
    warmup = BatchWarmup(full=16, start=0.25, ratio=0.5, unit=2)
    rows = [warmup.rows(step, 40) for step in range(40)]
    assert rows[0] == 4 and rows[10] == 10 and rows[19] == 16 and rows[20:] == [16] * 20, rows
    assert rows == sorted(rows) and all(r % 2 == 0 for r in rows)
    assert warmup.ramp_steps(40) == 20
    # A re-plan moves the ramp's end: the same step is earlier in a longer plan.
    assert warmup.rows(10, 80) < warmup.rows(10, 40)
    # Never under a row per rank and micro-batch, even where the start's share would be less.
    assert BatchWarmup(full=16, start=0.1, ratio=0.5, unit=8).rows(0, 40) == 8
    assert BatchWarmup(full=16, start=0.25, ratio=0.0, unit=2).rows(0, 40) == 16  # none: the full batch


def test_each_rank_and_micro_batch_gets_its_share_of_the_steps_rows() -> None:
    warmup = BatchWarmup(full=16, start=0.25, ratio=0.5, unit=4)
    for step in range(40):
        on_two = warmup.micro_batch_rows(step, 40, world=2, micro_batches=2)
        assert sum(on_two) * 2 == warmup.rows(step, 40) and max(on_two) - min(on_two) <= 1 and min(on_two) >= 1
    # Resumed on one rank that accumulates twice as much: the same global rows each step.
    one = BatchWarmup(full=16, start=0.25, ratio=0.5, unit=4)
    assert all(sum(one.micro_batch_rows(s, 40, 1, 4)) == warmup.rows(s, 40) for s in range(40))


@pytest.mark.parametrize(("start", "unit"), [(0.25, 2), (0.1, 8), (0.5, 1)])
def test_a_plans_cost_in_full_steps_is_the_sum_of_its_steps_shares(start: float, unit: int) -> None:
    warmup = BatchWarmup(full=16, start=start, ratio=0.5, unit=unit)
    for done, total in [(0, 240), (50, 240), (119, 240), (120, 240), (0, 7), (3, 10), (239, 240), (300, 240)]:
        exact = sum(warmup.share(step, total) for step in range(done, total))
        assert warmup.full_steps(done, total) == pytest.approx(exact, abs=0.02 * total + 0.5), (done, total)
    assert warmup.full_steps(0, 240) < 240 * (1 - 0.5 * (1 - 0.5) / 2) + 1  # the ramp's steps cost less


def test_the_cost_of_steps_between_two_steps_is_their_shares_sum_and_one_each_without_a_warm_up() -> None:
    warmup = BatchWarmup(full=16, start=0.25, ratio=0.5, unit=2)
    for start, end in [(0, 10), (10, 120), (0, 240), (150, 240), (240, 240), (20, 10)]:
        exact = sum(warmup.share(step, 240) for step in range(start, end))
        assert full_steps_between(warmup, start, end, 240) == pytest.approx(exact, abs=2.0), (start, end)
        assert full_steps_between(None, start, end, 240) == max(end - start, 0)
    # The first tenth of the steps costs well under a tenth of the plan, the steps after the ramp one each.
    assert full_steps_between(warmup, 0, 24, 240) < 0.5 * 24
    assert full_steps_between(warmup, 150, 240, 240) == 90


def test_the_record_says_the_first_and_full_rows_and_tokens_of_packed_blocks() -> None:
    warmup = BatchWarmup(full=16, start=0.25, ratio=0.5, unit=2)
    assert warmup.record(128) == {
        "first_rows": 4, "full_rows": 16, "ratio": 0.5, "first_tokens": 512, "full_tokens": 2048
    }  # fmt: skip
    assert "first_tokens" not in warmup.record()


def test_a_batch_warm_up_is_refused_where_a_batch_is_one_row_and_sized_from_the_options() -> None:
    from train.common.errors import ConfigError
    from train.config import load_config
    from train.run.batches import batch_warmup, check_batch_warmup

    flat = load_config([], {"MLM_BATCH_WARMUP_RATIO": "0.3", "MLM_PADDING": "padding_free"})
    with pytest.raises(ConfigError, match=r"^MLM_BATCH_WARMUP_RATIO=0.3: a batch warm-up trains fewer rows .* "
                       r"MLM_PADDING=padding_free lays a batch out as one row"):  # fmt: skip
        check_batch_warmup(flat.schedule, flat.data)
    config = load_config([], {"MLM_BATCH_WARMUP_RATIO": "0.3", "MLM_PER_DEVICE_TRAIN_BATCH_SIZE": "8",
                              "MLM_GRADIENT_ACCUMULATION_STEPS": "2"})  # fmt: skip
    check_batch_warmup(config.schedule, config.data)
    assert batch_warmup(config.schedule, config.training) == BatchWarmup(full=16, start=0.25, ratio=0.3, unit=2)
    unset = load_config([], {})
    assert batch_warmup(unset.schedule, unset.training) is None
    with pytest.raises(ConfigError, match=r"^MLM_BATCH_WARMUP_START=1(\.0)?: expected a number between 0 and 1"):
        load_config([], {"MLM_BATCH_WARMUP_START": "1"})
