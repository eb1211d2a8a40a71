"""A rollback as run.json records it and in words (train/common/rollbacks.py): what the report, the card and the
trackers say of a run's rollbacks, run.json read as data."""

from __future__ import annotations

from train.common.rollbacks import RollbackRecord, rollback_words, rollbacks_of

SPIKE = RollbackRecord("2026-12-08T01:00:00+00:00", 12, "spike", "a loss spike", "checkpoint-10", (11, 12), 4, 0.5)
RECORDED = {"limit": 3, "made": 1, "rollbacks": [SPIKE.record()]}  # as run.json's rollbacks holds it


def test_a_record_reads_back_as_written_and_in_words() -> None:
    written = SPIKE.record()
    assert written["skipped_steps"] == [11, 12] and RollbackRecord.of(written) == SPIKE
    assert SPIKE.words() == (
        "step 12 (a loss spike): back to checkpoint-10, steps 11-12 skipped, peak learning rate x0.5"
    )


def test_runs_rollbacks_in_words_what_does_not_read_left_out() -> None:
    nan = RollbackRecord("t", 30, "non-finite", "loss is nan", "checkpoint-20", (21, 30), 10, 1.0).record()
    assert rollback_words({"limit": 3, "made": 2, "rollbacks": [SPIKE.record(), nan]}) == (
        f"{SPIKE.words()}; step 30 (loss is nan): back to checkpoint-20, steps 21-30 skipped"
    )
    assert rollback_words({"limit": 3, "made": 0, "rollbacks": []}) == "none" and rollback_words(None) is None
    assert rollbacks_of({"rollbacks": [{"detected_at_step": "x"}, 3, {**nan, "skipped_steps": [1]}]}) == []
    assert rollbacks_of([SPIKE.record()]) == []  # not run.json's form
