"""bench/real.py: the real-corpus series' models, recipes and their flags, run order and summary."""

from __future__ import annotations

import math

import pytest

from bench import real
from bench.demo import SMALL_MODEL
from tests.bench.records import RUNS, flag


def test_real_series_runs_five_recipes_of_the_tiny_model_by_default():
    settings = real.default_real_settings("cpu")
    assert settings.models == ["tiny"]
    assert settings.recipes == ["ours", "ours-dense", "run_mlm", "packed", "run_mlm-group"]
    assert real.MODELS["tiny"] == SMALL_MODEL  # the demo series' CPU model
    assert "n_layers=6" in real.MODELS["mid"] and "dim=384" in real.MODELS["mid"]
    assert all("vocab_size=30522" in overrides for overrides in real.MODELS.values())


def test_every_real_recipe_trains_the_same_model_data_steps_and_batch():
    settings = real.RealSettings("cpu", max_steps=7, batch_size=16)
    argvs = {name: real.recipe_flags(name, settings, "mid", "/c.txt", "/tok") for name in real.RECIPES}
    for name, argv in argvs.items():
        assert flag(argv, "--config_overrides") == real.MODELS["mid"], name
        assert flag(argv, "--tokenizer_name") == "/tok", name
        assert flag(argv, "--train_file" if name.startswith("run_mlm") else "--dataset") == "/c.txt", name
        assert flag(argv, "--max_steps") == "7" and flag(argv, "--per_device_train_batch_size") == "16", name
        assert flag(argv, "--max_seq_length") == "128" and flag(argv, "--seed") == "42", name
    assert flag(argvs["ours"], "--padding") == "dynamic" and flag(argvs["ours"], "--masked_only_head") == "true"
    assert flag(argvs["ours-dense"], "--masked_only_head") == "false"
    assert (
        flag(argvs["packed"], "--padding") == "packed" and flag(argvs["packed-dense"], "--masked_only_head") == "false"
    )
    assert flag(argvs["run_mlm"], "--line_by_line") == "true" and "--line_by_line" not in argvs["run_mlm-group"]
    assert [real.recipe_module(n) for n in ("ours", "packed", "run_mlm", "run_mlm-group")] == [
        "bench.harness", "bench.harness", "bench.run_mlm", "bench.run_mlm"
    ]  # fmt: skip
    with pytest.raises(ValueError, match="unknown recipe"):
        real.recipe_flags("seed", settings, "tiny", "/c.txt", "/tok")


def test_on_a_gpu_every_real_recipe_gets_bf16_and_only_a_cpu_pads_to_the_longest():
    gpu, cpu = real.RealSettings("cuda"), real.RealSettings("cpu")
    for name in real.RECIPES:
        on_gpu, on_cpu = (real.recipe_flags(name, s, "tiny", "/c.txt", "/tok") for s in (gpu, cpu))
        assert flag(on_gpu, "--bf16") == "true" and flag(on_gpu, "--tf32") == "true", name
        assert "--bf16" not in on_cpu and "--pad_to_multiple_of" not in on_gpu, name
        assert ("--pad_to_multiple_of" in on_cpu) == (name not in real.RUN_MLM_RECIPES), name


def test_the_report_lists_each_recipe_with_placeholders_for_the_machines_paths():
    settings = real.RealSettings("cpu", models=["mid", "tiny"], recipes=["ours", "run_mlm"])
    described = real.describe_recipes(settings)
    assert list(described) == ["ours", "run_mlm"]
    assert described["run_mlm"]["module"] == "bench.run_mlm" and described["ours"]["what"] == real.RECIPES["ours"]
    for recipe in described.values():
        assert flag(recipe["flags"], "--config_overrides") == "<model>"
        assert flag(recipe["flags"], "--tokenizer_name") == "<tokenizer>"
    assert flag(described["ours"]["flags"], "--dataset") == "<corpus>"


def test_both_parsers_read_the_same_training_arguments_from_the_real_flags():
    """Our job's schema and run_mlm.py's HfArgumentParser take the flags the series hands them, to the same values."""
    from bench.run_mlm import parse
    from train.config import load_config

    settings = real.RealSettings("cpu", max_steps=7, batch_size=16)
    extra = ["--output_dir", "/tmp/unused-bench-output"]
    ours = load_config(real.recipe_flags("ours-dense", settings, "tiny", "/c.txt", "/tok") + extra, environ={})
    recipe, theirs = parse(real.recipe_flags("run_mlm", settings, "tiny", "/c.txt", "/tok") + extra)
    for name in ("max_steps", "per_device_train_batch_size", "seed", "learning_rate", "optim", "eval_strategy"):
        assert getattr(ours.training, name) == getattr(theirs, name), name
    assert (ours.model.config_overrides, ours.data.max_seq_length) == (recipe.config_overrides, recipe.max_seq_length)
    assert ours.model.masked_only_head is False and recipe.line_by_line is True


def test_real_runs_alternate_within_each_model():
    settings = real.RealSettings("cpu", models=["tiny", "mid"], recipes=["ours", "run_mlm"], pairs=2)
    assert real.schedule(settings) == [
        ("tiny", 1, "ours"), ("tiny", 1, "run_mlm"), ("tiny", 2, "ours"), ("tiny", 2, "run_mlm"),
        ("mid", 1, "ours"), ("mid", 1, "run_mlm"), ("mid", 2, "ours"), ("mid", 2, "run_mlm"),
    ]  # fmt: skip


def test_real_summary_takes_ratios_within_each_pair():
    settings = real.RealSettings("cpu", recipes=["ours", "ours-dense", "run_mlm"])
    summary = real.summarise(RUNS, settings)["tiny"]
    ratios = {c["label"]: c for c in summary["comparisons"]}
    assert set(ratios) == {
        "ours / run_mlm line_by_line",
        "masked-only head, dynamic (ours / ours-dense)",
        "the rest, dynamic (ours-dense / run_mlm)",
    }  # only comparisons whose two recipes ran
    total = ratios["ours / run_mlm line_by_line"]
    assert total["values"] == [8.0, 6.0]
    assert (total["min"], total["median"], total["max"]) == (6.0, 7.0, 8.0)
    assert ratios["masked-only head, dynamic (ours / ours-dense)"]["values"] == [4.0, 3.0]
    (share,) = summary["head_share"]
    assert share["padding"] == "dynamic"
    assert share["values"] == pytest.approx([2 / 3, math.log(3) / math.log(6)])
    assert summary["recipes"]["ours"]["real_tokens_per_s"] == {"min": 800.0, "median": 900.0, "max": 1000.0}


def test_real_summary_compares_whole_process_walls_within_each_pair():
    walls = {("ours", 1): 10.0, ("ours-dense", 1): 40.0, ("run_mlm", 1): 40.0,
             ("ours", 2): 12.0, ("ours-dense", 2): 42.0, ("run_mlm", 2): 42.0 * 0.97}  # fmt: skip
    runs = [{**r, "wall_s": walls.get((r["recipe"], r["rep"]), 99.0)} for r in RUNS]
    settings = real.RealSettings("cpu", recipes=["ours", "ours-dense", "run_mlm"])
    wall = {c["label"]: c for c in real.summarise(runs, settings)["tiny"]["wall"]}
    assert set(wall) == {"run_mlm line_by_line / ours", "run_mlm line_by_line / ours-dense (the same head)"}
    assert wall["run_mlm line_by_line / ours"]["values"] == pytest.approx([4.0, 3.5 * 0.97])
    assert wall["run_mlm line_by_line / ours-dense (the same head)"]["values"] == pytest.approx([1.0, 0.97])
