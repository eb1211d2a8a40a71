"""bench/step_parts.py's pure parts: the masking of its batches and its table's shares and ratios."""

from __future__ import annotations

import torch

from bench.step_parts import BATCH, BLOCK, batch_of, table


def test_a_batch_masks_the_rate_asked_and_labels_only_those() -> None:
    batch = batch_of(0.3, torch.Generator().manual_seed(0))
    masked = batch["labels"] != -100
    assert batch["input_ids"].shape == (BATCH, BLOCK)
    assert abs(masked.float().mean().item() - 0.3) < 0.03
    assert torch.equal(batch["labels"][masked], batch["input_ids"][masked])


def test_the_table_gives_each_part_its_share_and_each_step_against_15_percent() -> None:
    parts = {"step": 0.2, "encoder": 0.05, "head": 0.13, "optimizer": 0.02}
    rows = table({("tiny", "masked-only", 0.15): {**parts, "step": 0.1}, ("tiny", "masked-only", 0.3): parts})
    assert rows[3] == "| tiny | masked-only | 30% | 200.0 | 50.0 (25%) | 130.0 (65%) | 20.0 (10%) | 2.00x |"
