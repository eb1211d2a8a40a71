"""bench/flops.py: FLOPs per token, MFU and the device peaks, on made-up sizes."""

from __future__ import annotations

import pytest

from bench.flops import flops_per_token, mfu, peak_flops


def test_flops_per_token_is_six_n_plus_the_attention_term():
    # 6 x 1000 parameters + 12 x 2 layers x 10 hidden x 5 tokens
    assert flops_per_token(1000, 2, 10, 5) == 6000 + 1200


def test_full_distilbert_at_128_tokens():
    # DistilBERT-base: 66,985,530 parameters, 6 layers, dim 768.
    assert flops_per_token(66_985_530, 6, 768, 128) == pytest.approx(6 * 66_985_530 + 12 * 6 * 768 * 128)
    assert flops_per_token(66_985_530, 6, 768, 128) == pytest.approx(4.09e8, rel=1e-3)


def test_masked_only_head_takes_off_the_head_work_at_unmasked_positions():
    dense = flops_per_token(1000, 2, 10, 5, vocab_size=50)
    assert flops_per_token(1000, 2, 10, 5, vocab_size=50, head_fraction=1.0) == dense
    # The transform (10 x 10) and the projection (10 x 50) run at 15 % of the positions.
    assert flops_per_token(1000, 2, 10, 5, vocab_size=50, head_fraction=0.15) == pytest.approx(
        dense - 6 * (100 + 500) * 0.85
    )


def test_head_fraction_outside_zero_to_one_is_rejected():
    with pytest.raises(ValueError, match="head_fraction"):
        flops_per_token(1000, 2, 10, 5, vocab_size=50, head_fraction=1.5)


def test_mfu_is_achieved_over_peak():
    assert mfu(4e8, 1e6, 1e15) == pytest.approx(0.4)
    assert mfu(4e8, 1e6, 1e15, devices=2) == pytest.approx(0.2)
    with pytest.raises(ValueError):
        mfu(4e8, 1e6, 0)


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H200", 989.4e12),
        ("NVIDIA H200 NVL", 835e12),
        ("NVIDIA H100 80GB HBM3", 989.4e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA GeForce RTX 4090", None),
        ("cpu", None),
    ],
)
def test_peak_by_device_name(name, peak):
    assert peak_flops(name) == peak


def test_the_peak_table_names_the_three_gpus():
    assert all(peak_flops(f"NVIDIA {name}") for name in ("H100", "H200", "A100"))
