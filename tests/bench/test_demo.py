"""bench/demo.py: the demo series' recipes, run order and summary."""

from __future__ import annotations

import pytest

from bench.demo import PROPOSED_DEFAULTS, SMALL_MODEL, common_flags, default_settings, recipe_flags, schedule, summarise
from bench.stats import run_metrics
from tests.bench.records import probe


def test_recipes_differ_only_in_their_own_flags():
    cpu = default_settings("cpu")
    seed, ours = recipe_flags("seed", cpu), recipe_flags("ours", cpu)
    assert seed == ["--config", "configs/seed.yaml", "--fp16", "false"]  # fp16 is off where there is no CUDA
    proposed = [arg for key, value in PROPOSED_DEFAULTS.items() for arg in (f"--{key}", value)]
    assert ours == [*proposed, "--pad_to_multiple_of", "1"]  # as the launcher decides on a CPU
    common = common_flags(cpu, "tok", cpu.max_steps)
    assert common[common.index("--config_overrides") + 1] == SMALL_MODEL
    assert "vocab_size=30522" in SMALL_MODEL
    gpu = default_settings("cuda")
    assert recipe_flags("seed", gpu) == ["--config", "configs/seed.yaml"]
    assert {"--bf16", "--tf32"} <= set(recipe_flags("ours", gpu))
    assert "--pad_to_multiple_of" not in recipe_flags("ours", gpu)
    with pytest.raises(ValueError):
        recipe_flags("nonsense", cpu)


def test_runs_alternate_between_the_recipes():
    settings = default_settings("cpu")
    settings.repeats = 3
    assert schedule(settings) == [(1, "seed"), (1, "ours"), (2, "seed"), (2, "ours"), (3, "seed"), (3, "ours")]


def test_the_summary_takes_each_ratio_to_the_seed_within_a_repetition():
    metrics = run_metrics(probe(), started=0.0, ended=42.0)
    tokens = {(1, "seed"): 100.0, (1, "ours"): 300.0, (2, "seed"): 200.0, (2, "ours"): 500.0}
    runs = [
        {**metrics, "recipe": name, "real_tokens_per_s": value, "losses": [[2, 10.0 + rep], [4, 9.0 + rep]]}
        for (rep, name), value in tokens.items()
    ]
    result = summarise(runs, default_settings("cpu"))
    ratio = result["ratios"]["ours"]["real_tokens_per_s"]
    assert ratio["values"] == [3.0, 2.5]  # not 300 / 200 or 500 / 100: each ours run over the seed run beside it
    assert (ratio["min"], ratio["median"], ratio["max"]) == (2.5, 2.75, 3.0)
    assert result["summary"]["seed"]["real_tokens_per_s"] == {"min": 100.0, "median": 150.0, "max": 200.0}
    assert "mfu" not in result["summary"]["ours"]  # no peak for a CPU
    assert result["loss_curves"]["rows"] == [(2, 11.0, 11.0), (4, 10.0, 10.0)]  # the first repetition's curves
    assert "seed" not in result["ratios"]
