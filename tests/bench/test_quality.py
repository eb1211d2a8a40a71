"""bench/quality.py: the time-to-quality series' settings, each system's flags, the judge's options, the target and
time-to-target arithmetic, and the report."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bench import quality
from bench.real import MODELS
from tests.bench.records import flag

ENV = {"host": "vm", "cpu_count": 2, "gpu": None, "torch": "2.x", "transformers": "5.x"}


def point(step: int, seconds: float, loss: float) -> dict[str, float]:
    return {"step": step, "seconds": seconds, "loss": loss}


def test_cpu_default_is_the_hand_run_comparison_tiny_240_steps_of_16():
    settings = quality.default_quality_settings("cpu")
    assert (settings.model, settings.max_steps, settings.batch_size) == ("tiny", 240, 16)
    assert settings.systems[0] == quality.REFERENCE == "run_mlm"
    assert quality.checkpoint_steps(settings) == [30, 60, 90, 120, 150, 180, 210, 240]
    quality.check(settings)
    quality.check(quality.default_quality_settings("cuda"))


def test_the_last_step_is_a_checkpoint_even_off_the_save_interval():
    assert quality.checkpoint_steps(quality.QualitySettings("cpu", max_steps=50, save_steps=20)) == [20, 40, 50]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": "huge"}, "unknown model"),
        ({"systems": ["run_mlm", "nope"]}, "unknown system"),
        ({"systems": ["ours"]}, "run_mlm must run"),
        ({"save_steps": 0}, "save_steps"),
        ({"save_steps": 300}, "save_steps"),
        ({"heldout": 0}, "heldout"),
        ({"baseline_rates": []}, "baseline_rates"),
        ({"baseline_rates": [0.0]}, "baseline_rates"),
    ],
)
def test_check_names_what_is_wrong(change, message):
    settings = quality.QualitySettings("cpu", **change)
    with pytest.raises(ValueError, match=message):
        quality.check(settings)


def test_both_systems_train_the_same_model_data_steps_batch_and_checkpoints():
    settings = quality.QualitySettings("cpu", max_steps=40, batch_size=8, save_steps=10)
    theirs = quality.run_mlm_flags(settings, "/train.txt", "/tok", "/out", 3e-4)
    assert flag(theirs, "--learning_rate") == "0.0003"
    assert flag(theirs, "--config_overrides") == MODELS["tiny"] and flag(theirs, "--model_type") == "distilbert"
    assert flag(theirs, "--train_file") == "/train.txt" and flag(theirs, "--tokenizer_name") == "/tok"
    assert flag(theirs, "--line_by_line") == "true" and flag(theirs, "--output_dir") == "/out"
    assert "--save_total_limit" not in theirs  # the stock Trainer keeps every checkpoint unless told otherwise
    for name in ("ours", "ours-packed"):
        ours = quality.our_options(name, settings, "/train.txt", "/tok", "/out")
        assert ours["model_name_or_path"] == "scratch:distilbert" and ours["config_overrides"] == MODELS["tiny"]
        assert ours["dataset"] == "/train.txt" and ours["tokenizer_name"] == "/tok"
        assert ours["validation_split_percentage"] == "0" and ours["eval_strategy"] == "no"  # the judge's text alone
        assert ours["save_total_limit"] == "0"  # our default keeps 2; the curve needs every one
        for option in ("max_steps", "per_device_train_batch_size", "save_steps", "seed", "max_seq_length"):
            assert ours[option] == flag(theirs, f"--{option}"), (name, option)
        assert ours["save_strategy"] == flag(theirs, "--save_strategy") == "steps"
    assert "padding" not in quality.our_options("ours", settings, "/t", "/k", "/o")  # our default, as shipped
    assert quality.our_options("ours-packed", settings, "/t", "/k", "/o")["padding"] == "packed"
    # the classic recipe at run_mlm.py's best rate; our default keeps its recipe's own
    assert quality.our_options("ours-classic", settings, "/t", "/k", "/o", 3e-4)["learning_rate"] == "0.0003"
    assert "learning_rate" not in quality.our_options("ours", settings, "/t", "/k", "/o", 3e-4)
    assert quality.our_options("ours-mask-schedule", settings, "/t", "/k", "/o")["final_mlm_probability"] == "0.15"
    with pytest.raises(ValueError):
        quality.our_options("run_mlm", settings, "/t", "/k", "/o")
    # another training seed reaches every system; the judge keeps its own (its masks)
    reseeded = replace(settings, seed=7)
    assert flag(quality.run_mlm_flags(reseeded, "/t", "/k", "/o", 3e-4), "--seed") == "7"
    assert quality.our_options("ours", reseeded, "/t", "/k", "/o")["seed"] == "7"


def test_options_become_the_command_line_the_cache_is_filled_with():
    assert quality.as_flags({"dataset": "/t", "seed": "42"}) == ["--dataset", "/t", "--seed", "42"]


def test_the_judge_scores_every_checkpoint_on_the_same_text_tokenizer_and_masks():
    a = quality.judge_options("/run_mlm/checkpoint-30", "/train.txt", "/held.txt", "/tok", "/j1")
    b = quality.judge_options("/ours/checkpoint-240", "/train.txt", "/held.txt", "/tok", "/j2")
    assert a["model_name_or_path"] != b["model_name_or_path"]
    same = {k: v for k, v in a.items() if k not in ("model_name_or_path", "output_dir")}
    assert same == {k: v for k, v in b.items() if k not in ("model_name_or_path", "output_dir")}
    assert same["validation_file"] == "/held.txt" and same["tokenizer_name"] == "/tok"
    assert same["seed"] == str(quality.SEED) and float(same["eval_mlm_probability"]) == quality.EVAL_MLM_PROBABILITY


def test_the_baseline_is_the_sweeps_rate_with_the_lowest_final_judged_loss():
    assert quality.BASELINE_RATES == [1e-4, 3e-4, 5e-4, 1e-3, 2e-3, 4e-3]  # 2e-3 won on 2026-12-05: bracketed
    assert quality.best_rate({1e-4: 7.1, 3e-4: 6.4, 5e-4: 6.5, 1e-3: float("nan")}) == 3e-4
    with pytest.raises(ValueError, match="diverged"):
        quality.best_rate({1e-3: float("nan")})


def test_time_to_target_is_the_first_checkpoint_at_or_below_it():
    curve = [point(60, 20.0, 9.0), point(30, 10.0, 9.5), point(90, 30.0, 8.9)]
    assert quality.time_to_target(curve, 9.0) == point(60, 20.0, 9.0)  # at the target counts; by step, not order
    assert quality.time_to_target(curve, 8.0) is None


def test_the_crossing_is_where_the_line_between_the_checkpoints_either_side_meets_the_target():
    curve = [point(60, 20.0, 8.5), point(30, 10.0, 9.5), point(90, 30.0, 8.0)]
    assert quality.crossing_seconds(curve, 9.0) == pytest.approx(15.0)  # halfway from 9.5 to 8.5: halfway in time
    assert quality.crossing_seconds(curve, 8.5) == 20.0  # at a checkpoint: its time
    assert quality.crossing_seconds(curve, 9.9) == 10.0  # the first checkpoint already at it: its own time
    assert quality.crossing_seconds(curve, 7.0) is None
    # Never after the first checkpoint at or below the target, never before the last one above it.
    wavy = [point(30, 10.0, 9.5), point(60, 20.0, 9.6), point(90, 30.0, 8.6), point(120, 40.0, 9.7)]
    assert 20.0 < quality.crossing_seconds(wavy, 9.0) < 30.0 == quality.time_to_target(wavy, 9.0)["seconds"]


def test_summary_targets_run_mlm_final_loss_and_divides_its_time_by_each_systems():
    curves = {
        "run_mlm": [point(30, 40.0, 9.6), point(60, 80.0, 9.2), point(90, 120.0, 9.0)],
        "ours": [point(30, 10.0, 9.5), point(60, 15.0, 8.95), point(90, 20.0, 8.9)],
        "ours-packed": [point(30, 12.0, 9.4), point(60, 18.0, 9.3)],
    }
    summary = quality.summarise(curves, {"run_mlm": 130.0, "ours": 25.0})
    assert summary["target"] == 9.0
    mine, theirs, packed = (summary["systems"][n] for n in ("ours", "run_mlm", "ours-packed"))
    assert theirs["time_to_target_s"] == 120.0 and theirs["ratio"] == 1.0 and theirs["target_step"] == 90
    assert mine["time_to_target_s"] == 15.0 and mine["target_step"] == 60 and mine["ratio"] == 8.0
    assert (mine["final_loss"], mine["final_step"], mine["wall_s"]) == (8.9, 90, 25.0)
    assert packed["time_to_target_s"] is None and packed["ratio"] is None and packed["wall_s"] is None
    # By crossing: run_mlm.py's own at its final checkpoint (120 s); ours between 10 s (9.5) and 15 s (8.95).
    assert theirs["crossing_s"] == 120.0 and theirs["crossing_ratio"] == 1.0
    assert mine["crossing_s"] == pytest.approx(10.0 + 5.0 * 0.5 / 0.55)
    assert (
        mine["crossing_ratio"] == pytest.approx(120.0 / mine["crossing_s"]) and mine["crossing_ratio"] > mine["ratio"]
    )
    assert packed["crossing_s"] is None and packed["crossing_ratio"] is None
    assert quality.summarise({"ours": curves["ours"]}, {}) == {"target": None, "systems": {}}


def test_report_states_the_target_each_time_and_the_ratio():
    settings = quality.QualitySettings("cpu", max_steps=90)
    curves = {"run_mlm": [point(30, 40.0, 9.6), point(90, 120.0, 9.0)], "ours": [point(30, 10.0, 9.5)]}
    result = {
        "date": "2026-12-03T17:00:00+00:00", "environment": ENV, "settings": vars(settings),
        "model": MODELS["tiny"], "corpus": {"train_lines": 1000, "heldout_lines": 50}, "curves": curves,
        "summary": quality.summarise(curves, {"run_mlm": 130.0, "ours": 12.0}),
    }  # fmt: skip
    text = quality.quality_markdown({**result, "sweep": {"finals": {"0.0001": 9.3, "0.0005": 9.0}, "best": "0.0005"}})
    assert "0.0001: 9.3000, 0.0005: 9.0000; the best, **0.0005**, is the baseline" in text
    assert "CPU, 2 cores" in text and "**9.0000**" in text and "90 steps of 16" in text
    assert "Training seed 42." in text
    assert "| run_mlm |" in text and "120.0 (90)" in text and "**1.00x**" in text
    assert "| ours |" in text and "never" in text and "n/a" in text
    assert "### ours" in text and "| 30 | 10.0 | 9.5000 |" in text
    assert "| 120.0 | **1.00x** |" in text  # run_mlm.py's crossing, at its final checkpoint
    assert "crossing is where the straight line" in text
    renamed = quality.quality_markdown({**result, "systems": {"run_mlm": "the baseline", "ours": "as it was then"}})
    assert "| ours | as it was then |" in renamed  # a results file's own words for its systems
    empty = {**result, "curves": {}, "summary": {"target": None, "systems": {}}}
    assert "no target" in quality.quality_markdown(empty)


def test_a_results_file_is_rendered_again_by_todays_rules(tmp_path):
    curves = {
        "run_mlm": [point(30, 40.0, 9.6), point(90, 120.0, 9.0)],
        "ours": [point(30, 10.0, 9.5), point(60, 20.0, 8.5)],
    }
    result = {
        "date": "2026-12-03T17:00:00+00:00", "environment": ENV, "settings": vars(quality.QualitySettings("cpu")),
        "model": MODELS["tiny"], "corpus": {"train_lines": 1000, "heldout_lines": 50}, "curves": curves,
        "walls": {"run_mlm": 130.0}, "summary": {"target": 9.0, "systems": {}},  # as written before the crossing
    }  # fmt: skip
    path = tmp_path / "2026-12-03-vm-quality.json"
    path.write_text(json.dumps(result), encoding="utf-8")
    quality.rerendered(path)
    again = json.loads(path.read_text(encoding="utf-8"))
    assert again["summary"]["systems"]["ours"]["crossing_s"] == pytest.approx(15.0)
    assert again["curves"] == curves and again["walls"] == result["walls"]
    assert "| ours |" in path.with_suffix(".md").read_text(encoding="utf-8")
