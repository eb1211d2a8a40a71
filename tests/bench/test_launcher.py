"""bench/launcher.py: the launcher's decisions for a run it does not start."""

from __future__ import annotations

from bench.launcher import padding_flags, precision_flags


def test_a_gpu_run_gets_bf16_and_tf32_and_a_cpu_run_pads_to_the_longest():
    assert precision_flags("cuda") == ["--bf16", "true", "--tf32", "true"]
    assert precision_flags("cpu") == []
    assert padding_flags("cpu") == ["--pad_to_multiple_of", "1"]
    assert padding_flags("cuda") == []
