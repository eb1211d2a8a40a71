"""bench/run.py: the command line's settings for both series, checked before anything runs."""

from __future__ import annotations

import pytest

from bench.run import demo_settings, parse_args, real_settings, selected_series


def test_demo_settings_from_the_command_line():
    settings = demo_settings(parse_args(["--repeats", "1", "--recipes", "seed,current", "--threads", "0"]), "cpu")
    assert (settings.repeats, settings.recipes, settings.threads) == (1, ["seed", "current"], 0)
    assert settings.max_steps == 10  # the CPU default where the command line says nothing
    assert demo_settings(parse_args([]), "cuda").extras == ["packed", "ours-batch256", "packed-compile"]
    assert demo_settings(parse_args(["--extras", ""]), "cuda").extras == []  # none, not the GPU's three


def test_both_series_run_on_a_cpu_and_only_the_demo_on_a_gpu_unless_asked():
    assert selected_series(parse_args([]), "cpu") == ["demo", "real", "quality"]
    assert selected_series(parse_args([]), "cuda") == ["demo"]
    assert selected_series(parse_args(["--series", "real"]), "cuda") == ["real"]
    with pytest.raises(SystemExit, match="unknown series demos; expected demo, real"):
        selected_series(parse_args(["--series", "demos"]), "cpu")


def test_real_settings_from_the_command_line_are_checked():
    settings = real_settings(parse_args(["--real-models", "tiny,mid", "--real-steps", "4", "--real-pairs", "1"]), "cpu")
    assert (settings.models, settings.max_steps, settings.pairs, settings.threads) == (["tiny", "mid"], 4, 1, 1)
    with pytest.raises(ValueError, match="unknown model 'huge'"):
        real_settings(parse_args(["--real-models", "huge"]), "cpu")
    with pytest.raises(ValueError, match="unknown recipe 'seed'"):
        real_settings(parse_args(["--real-recipes", "ours,seed"]), "cpu")
    with pytest.raises(ValueError, match="at least 2 steps"):
        real_settings(parse_args(["--real-steps", "1"]), "cpu")
