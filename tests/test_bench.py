"""The benchmark's arithmetic: FLOPs per token, MFU, device peaks, throughput windows, ratio statistics, and the
recipes it compares. No timing: these check formulas on made-up records."""

from __future__ import annotations

import math

import pytest

from bench import real, report, startup
from bench.flops import PEAK_BF16_DENSE, flops_per_token, mfu, peak_flops
from bench.run import (
    PROPOSED_DEFAULTS,
    ROOT,
    SMALL_MODEL,
    common_flags,
    default_settings,
    parse_args,
    real_settings,
    recipe_flags,
    schedule,
)
from bench.stats import log_share, loss_agreement, paired_ratios, run_metrics, spread, warmup_steps


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
        ("NVIDIA H200", 989e12),
        ("NVIDIA H200 NVL", 835e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
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
    assert {"H100", "H200", "A100"} <= set(PEAK_BF16_DENSE)


def probe(**overrides):
    record = {
        # ten steps; the first two (a fifth) are warm-up, so the window is steps 3..10: 8 steps in 20 - 11 = 9 s
        "step_ends": [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0, 18.0, 20.0],
        "samples_per_step": 32,
        "real_tokens_per_sample": 13.0,
        "losses": [[2, 10.4], [4, 10.2]],
        "peak_rss_bytes": 700 * 2**20,
        "cuda_peak_bytes": None,
        "device_name": "cpu",
        "torch_threads": 1,
        "padding": "dynamic",
        "max_seq_length": 128,
        "masked_only_head": True,
        "mlm_probability": 0.15,
        "parameters": 4_416_442,
        "layers": 2,
        "hidden": 128,
        "vocab_size": 30522,
    }
    record.update(overrides)
    return record


def test_warmup_is_a_fifth_and_at_least_one_step():
    assert [warmup_steps(n) for n in (2, 4, 5, 10, 400)] == [1, 1, 1, 2, 80]


def test_run_metrics_time_the_steady_steps():
    metrics = run_metrics(probe(), started=0.0, ended=42.0)
    assert metrics["timed_steps"] == 8
    assert metrics["samples_per_s"] == pytest.approx(8 * 32 / 9)
    assert metrics["real_tokens_per_s"] == pytest.approx(8 * 32 * 13 / 9)
    assert metrics["first_step_s"] == 10.0
    assert metrics["wall_s"] == 42.0
    assert metrics["peak_memory_bytes"] == 700 * 2**20
    assert metrics["final_loss"] == 10.2
    assert metrics["mfu"] is None  # no peak for a CPU


def test_real_tokens_are_the_trainers_count_over_the_window():
    # 100 real tokens a step for the warm-up steps, then 400: the window (steps 3..10, 9 s) saw 8 x 400
    counted = [100, 200] + [200 + 400 * k for k in range(1, 9)]
    metrics = run_metrics(probe(tokens_seen=counted), started=0.0, ended=42.0)
    assert metrics["real_tokens_per_s"] == pytest.approx(8 * 400 / 9)
    assert metrics["real_tokens_source"] == "counted by the Trainer"
    # counting off (all zeros) or an older record: the estimate from the average tokens per sample
    for record in (probe(tokens_seen=[0] * 10), probe()):
        metrics = run_metrics(record, started=0.0, ended=42.0)
        assert metrics["real_tokens_per_s"] == pytest.approx(8 * 32 * 13 / 9)
        assert metrics["real_tokens_source"] == "estimated per sample"


def test_startup_is_split_into_its_stages():
    record = probe(python_started=3.0, imports_done=7.0, train_begin=9.5)
    stages = run_metrics(record, started=0.0, ended=42.0)["startup_s"]
    assert stages == {"process": 3.0, "imports": 4.0, "setup": 2.5, "first_step": 0.5}
    assert sum(stages.values()) == run_metrics(record, started=0.0, ended=42.0)["first_step_s"]
    assert run_metrics(probe(), started=0.0, ended=42.0)["startup_s"] is None  # an older record without them


def test_run_metrics_on_a_gpu_report_cuda_memory_and_mfu():
    record = probe(cuda_peak_bytes=5 * 2**30, device_name="NVIDIA H200", padding="packed", masked_only_head=False)
    metrics = run_metrics(record, started=0.0, ended=42.0)
    assert metrics["peak_memory_bytes"] == 5 * 2**30
    expected = flops_per_token(4_416_442, 2, 128, 128) * metrics["real_tokens_per_s"] / 989e12
    assert metrics["mfu"] == pytest.approx(expected)


def test_a_run_with_one_step_cannot_be_timed():
    with pytest.raises(ValueError, match="too few"):
        run_metrics(probe(step_ends=[10.0]), started=0.0, ended=1.0)


def test_spread_and_paired_ratios():
    ratios = paired_ratios([10.0, 20.0, 30.0], [1.0, 2.0, 5.0])
    assert ratios == [10.0, 10.0, 6.0]
    assert spread(ratios) == {"min": 6.0, "median": 10.0, "max": 10.0}
    assert spread([3.0, 1.0, 2.0, 10.0])["median"] == 2.5
    with pytest.raises(ValueError, match="pairs"):
        paired_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        spread([])


def test_loss_agreement_pairs_the_same_steps():
    agreement = loss_agreement([[2, 10.0], [4, 9.0], [6, 8.0]], [[2, 10.5], [4, 9.0]])
    assert agreement["rows"] == [(2, 10.0, 10.5), (4, 9.0, 9.0)]
    assert agreement["max_abs_diff"] == pytest.approx(0.5)
    assert agreement["max_rel_diff"] == pytest.approx(0.05)


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


def test_markdown_shows_the_ratio_and_both_loss_curves():
    run = run_metrics(probe(), started=0.0, ended=42.0)
    runs = [
        {**run, "recipe": name, "label": f"1-{name}", "eval_loss": 10.1, "load_avg_1m": [1.0, 1.0],
         "losses": probe()["losses"], "probe": probe()}
        for name in ("seed", "ours")
    ]  # fmt: skip
    result = {
        "date": "2026-01-01T00:00:00+00:00",
        "environment": {"host": "h", "gpu": None, "cpu_count": 2, "torch": "t", "transformers": "x"},
        "settings": {
            "device": "cpu",
            "model_overrides": SMALL_MODEL,
            "max_steps": 10,
            "repeats": 1,
            "recipes": ["seed", "ours"],
        },  # fmt: skip
        "recipes": {"seed": ["--config", "configs/seed.yaml"], "ours": ["--masked_only_head", "true"]},
        "common_flags": ["--max_steps", "10"],
        "proposed_defaults": PROPOSED_DEFAULTS,
        "tokenization": {"dynamic": {"samples": 50000, "cold_s": 5.0, "cached_s": 0.1, "cache_hit": True}},
        "first_step_demo": {"via": "entrypoint.sh", "cold_cache_s": 20.0},
        "runs": runs,
        "summary": {
            "seed": {
                m: spread([run[m]])
                for m in ("real_tokens_per_s", "samples_per_s", "wall_s", "first_step_s", "peak_memory_bytes")
            }
        },  # fmt: skip
        "ratios": {"ours": {"real_tokens_per_s": {**spread([20.0]), "values": [20.0]}}},
        "loss_curves": loss_agreement(probe()["losses"], [[2, 10.5], [4, 10.0]]),
    }
    text = report.markdown(result)
    assert "| real tokens per s | **20.00 [20.00 – 20.00]** | 20.00 |" in text
    assert "| step | seed | ours | difference |" in text
    assert "| 4 | 10.2000 | 10.0000 | -0.2000 |" in text
    assert "| dynamic | 50,000 | 5.00 | 0.10 | yes |" in text
    assert "via entrypoint.sh: 20.0 s with empty caches (tokenizer training and tokenization included).\n" in text
    # With the start-up runs (warm, reusing the first run's caches), their first step is the warm figure.
    demo = [{"wall_s": 8.0, "first_step_s": 6.0, "steps_s": 1.0}, {"wall_s": 7.5, "first_step_s": 5.0, "steps_s": 0.5}]
    result["startup"] = startup.summarise({"bare": [{"import_s": 2.0, "process_s": 2.5}]} | {
        name: [{"import_s": 2.0, "process_s": 2.5}] for name in ("trainer", "job", "launcher")}, demo)  # fmt: skip
    text = report.markdown(result)
    assert "tokenization included); warm, 5.5 [5.0 – 6.0] s (the start-up runs below).\n" in text


# ------------------------------------------------------------------------------------------ real-corpus series


def flag(argv, name):
    return argv[argv.index(name) + 1]


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


def test_both_parsers_read_the_same_training_arguments_from_the_real_flags():
    """Our job's schema and run_mlm.py's HfArgumentParser take the flags bench.run hands them, to the same values."""
    from bench.run_mlm import parse
    from train.config import load_config

    settings = real.RealSettings("cpu", max_steps=7, batch_size=16)
    extra = ["--output_dir", "/tmp/unused-bench-output"]
    ours = load_config(real.recipe_flags("ours-dense", settings, "tiny", "/c.txt", "/tok") + extra, environ={})
    recipe, theirs = parse(real.recipe_flags("run_mlm", settings, "tiny", "/c.txt", "/tok") + extra)
    for name in ("max_steps", "per_device_train_batch_size", "seed", "learning_rate", "optim", "eval_strategy"):
        assert getattr(ours.training, name) == getattr(theirs, name), name
    assert (ours.job.config_overrides, ours.job.max_seq_length) == (recipe.config_overrides, recipe.max_seq_length)
    assert ours.job.masked_only_head is False and recipe.line_by_line is True


def test_real_runs_alternate_within_each_model():
    settings = real.RealSettings("cpu", models=["tiny", "mid"], recipes=["ours", "run_mlm"], pairs=2)
    assert real.schedule(settings) == [
        ("tiny", 1, "ours"), ("tiny", 1, "run_mlm"), ("tiny", 2, "ours"), ("tiny", 2, "run_mlm"),
        ("mid", 1, "ours"), ("mid", 1, "run_mlm"), ("mid", 2, "ours"), ("mid", 2, "run_mlm"),
    ]  # fmt: skip


def test_real_settings_from_the_command_line_are_checked():
    settings = real_settings(parse_args(["--real-models", "tiny,mid", "--real-steps", "4", "--real-pairs", "1"]), "cpu")
    assert (settings.models, settings.max_steps, settings.pairs, settings.threads) == (["tiny", "mid"], 4, 1, 1)
    with pytest.raises(ValueError, match="unknown model 'huge'"):
        real_settings(parse_args(["--real-models", "huge"]), "cpu")
    with pytest.raises(ValueError, match="unknown recipe 'seed'"):
        real_settings(parse_args(["--real-recipes", "ours,seed"]), "cpu")
    with pytest.raises(ValueError, match="at least 2 steps"):
        real_settings(parse_args(["--real-steps", "1"]), "cpu")


def test_log_share_splits_a_speed_up_into_its_factors():
    # 8x = 4x (the head) x 2x (the rest): the head makes two thirds of it on a log scale.
    assert log_share(4.0, 8.0) == pytest.approx(2 / 3)
    assert log_share(8.0, 8.0) == pytest.approx(1.0)
    assert log_share(1.5, 1.02) is None  # no speed-up to share
    assert log_share(0.0, 8.0) is None


def real_run(model, rep, recipe, tokens_per_s, loss=10.0):
    metrics = run_metrics(probe(), started=0.0, ended=42.0)
    return {
        **metrics, "real_tokens_per_s": tokens_per_s, "final_loss": loss, "model": model, "rep": rep,
        "recipe": recipe, "label": f"real-{model}-{rep}-{recipe}", "load_avg_1m": [1.0, 2.0], "probe": probe(),
    }  # fmt: skip


RUNS = [
    real_run("tiny", 1, "ours", 800.0),
    real_run("tiny", 1, "ours-dense", 200.0),
    real_run("tiny", 1, "run_mlm", 100.0),
    real_run("tiny", 2, "ours", 900.0),
    real_run("tiny", 2, "ours-dense", 300.0),
    real_run("tiny", 2, "run_mlm", 150.0),
    real_run("tiny", 3, "ours", 1000.0),  # an unfinished pair: its ratios are left out, not paired across pairs
]


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


def test_real_report_shows_ratios_share_and_every_run():
    settings = real.RealSettings("cpu", recipes=["ours", "ours-dense", "run_mlm"])
    result = {
        "date": "2026-01-01T00:00:00+00:00",
        "environment": {"host": "h", "gpu": None, "cpu_count": 2, "torch": "t", "transformers": "x"},
        "settings": {**settings.__dict__},
        "corpus": {"file": "c.txt", "bytes": 4 * 2**20, "lines": 50_000, "source": "bench/corpus.py"},
        "tokenizer_vocab": 30522,
        "models": {"tiny": real.MODELS["tiny"]},
        "recipes": {
            n: {"module": real.recipe_module(n), "what": real.RECIPES[n], "flags": ["--x", n]} for n in settings.recipes
        },
        "tagged": False,
        "runs": RUNS,
        "summary": real.summarise(RUNS, settings),
    }
    text = report.real_markdown(result)
    assert "| ours / run_mlm line_by_line | **7.00× [6.00 – 8.00]** | 8.00, 6.00 |" in text
    assert "**64% [61% – 67%]** (per pair: 67%, 61%)" in text
    assert "50,000 lines; a 30,522-token WordPiece tokenizer" in text
    assert "| real-tiny-3-ours | 1,000 |" in text
    assert "- **run_mlm** (`python -m bench.run_mlm`)" in text


# ------------------------------------------------------------------------------------------------------ start-up


def test_startup_ratios_are_taken_per_round_and_checked_against_the_targets():
    def rounds(*seconds):
        return [{"import_s": s, "process_s": s + 0.5} for s in seconds]

    imports = {"bare": rounds(3.0, 4.0, 3.0), "trainer": rounds(4.5, 6.0, 4.5), "job": rounds(3.3, 4.4, 3.9),
               "launcher": rounds(1.5, 2.0, 1.5)}  # fmt: skip
    demo = [{"wall_s": 8.0, "first_step_s": 6.0, "steps_s": 1.0}, {"wall_s": 7.5, "first_step_s": 5.5, "steps_s": 0.5}]
    summary = startup.summarise(imports, demo)
    assert summary["imports"]["job"]["ratio_to_bare"]["median"] == pytest.approx(1.1)  # 1.1, 1.1, 1.3
    assert summary["imports"]["job"]["ratio_to_bare"]["max"] == pytest.approx(1.3)
    assert summary["demo"]["overhead_to_bare"]["median"] == pytest.approx(7.0 / 3.0)  # (8 - 1) / median bare 3
    rows = {row["what"]: row for row in summary["targets"]}
    assert rows["import train.job / bare import"]["met"] is True
    assert rows["warm 2-step demo run less its steps / bare import"]["met"] is False
    text = "\n".join(report.startup_markdown(summary))
    assert "| `import train.job` | 3.90 [3.30 – 4.40] | 4.40 [3.80 – 4.90] | 1.10 [1.10 – 1.30] |" in text
    assert "| warm 2-step demo run less its steps / bare import | 2.33 | ≤ 2.0 | **no** |" in text


def test_the_first_step_is_read_from_the_json_records_alike_cold_and_warm():
    assert startup.log_record('{"event": "train", "step": 1, "loss": 4.3}\n')["event"] == "train"
    for line in ('{"event": "launch"', "mlm-trainer: finished\n", "Tokenizing train:  50%|{bar}\n", "\n"):
        assert startup.log_record(line).get("event") != "train"


def test_a_startup_import_is_timed_inside_a_fresh_process():
    import os

    timed = startup.time_import("import json", os.environ, ROOT)
    assert 0 < timed["import_s"] < timed["process_s"]
