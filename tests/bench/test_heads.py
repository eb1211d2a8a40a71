"""bench/heads.py: the heads series' architectures and their configs, run flags, run order and summary; its
command line (bench/run.py) and its report (bench/report.py). Configs are built, no model and no run."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from bench import heads, real
from bench.heads_report import heads_markdown, heads_run_line
from bench.run import heads_settings, parse_args, selected_series
from tests.bench.records import flag, real_run


def built_config(name: str, settings: heads.HeadsSettings, tmp_path) -> object:
    """The architecture's config as our job builds it from the run's flags (train.model.scratch_config)."""
    from train.config import load_config
    from train.model.load import scratch_config

    model = f"scratch:{name}"
    if heads.config_json(name) is not None:
        model = str(tmp_path / f"{name}.json")
        (tmp_path / f"{name}.json").write_text(json.dumps(heads.config_json(name)), encoding="utf-8")
    argv = heads.run_flags(name, "dense", settings, "/c.txt", "/tok", model) + ["--output_dir", str(tmp_path / "o")]
    return scratch_config(load_config(argv, environ={}).model)


def test_the_cpu_series_runs_every_architecture_at_the_mid_size_and_the_gpu_the_three_base_models():
    cpu, gpu = heads.default_heads_settings("cpu"), heads.default_heads_settings("cuda")
    assert cpu.architectures == ["bert", "roberta", "modernbert", "deberta-v2", "electra", "albert", "xlm-roberta",
                                 "esm"]  # fmt: skip
    assert (cpu.size, cpu.pairs, cpu.threads) == ("mid", 3, 1)
    assert (gpu.architectures, gpu.size, gpu.batch_size) == (["bert", "roberta", "modernbert"], "base", 256)


@pytest.mark.parametrize("name", list(heads.ARCHITECTURES))
def test_each_architecture_builds_at_the_mid_size_with_every_field_it_names(name, tmp_path):
    config = built_config(name, heads.HeadsSettings("cpu"), tmp_path)
    assert config.model_type == name
    shape = (config.num_hidden_layers, config.hidden_size, config.intermediate_size, config.num_attention_heads)
    assert shape == (6, 384, 1536, 6)
    for key, value in heads.config_fields(name, "mid").items():
        assert getattr(config, key) == value, key


def test_the_architectures_keep_what_makes_them_themselves(tmp_path):
    settings = heads.HeadsSettings("cpu")
    modernbert = built_config("modernbert", settings, tmp_path)
    assert modernbert.layer_types == ["full_attention", "sliding_attention", "sliding_attention"] * 2
    assert modernbert.local_attention == 64  # local at 128 tokens: each token sees +-32
    assert built_config("electra", settings, tmp_path).embedding_size == 384
    assert built_config("albert", settings, tmp_path).embedding_size == 128
    deberta = built_config("deberta-v2", settings, tmp_path)
    assert deberta.relative_attention is True and deberta.pos_att_type == ["p2c", "c2p"]
    assert deberta.position_biased_input is False and deberta.hidden_size == 384  # the json, then the overrides
    esm = built_config("esm", settings, tmp_path)
    assert esm.position_embedding_type == "rotary" and esm.token_dropout is True


def test_the_base_size_is_bert_base_and_roberta_base_and_modernbert_base(tmp_path):
    settings = heads.HeadsSettings("cpu", size="base")  # a GPU's flags (bf16) do not parse on a CPU
    for name in ("bert", "roberta"):
        config = built_config(name, settings, tmp_path)
        assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (12, 768, 3072)
    modernbert = built_config("modernbert", settings, tmp_path)
    assert (modernbert.num_hidden_layers, modernbert.hidden_size, modernbert.intermediate_size) == (22, 768, 1152)


def test_a_run_is_the_real_series_packed_recipe_with_another_model_and_only_the_head_differs():
    settings = heads.HeadsSettings("cpu", max_steps=7, batch_size=4)
    dense, masked = (heads.run_flags("roberta", h, settings, "/c.txt", "/tok", "scratch:roberta") for h in heads.HEADS)
    packed = real.recipe_flags("packed", heads.as_real(settings), "tiny", "/c.txt", "/tok")
    assert len(masked) == len(packed)
    assert [a for a, b in zip(masked, packed, strict=True) if a != b] == [
        "scratch:roberta", heads.config_overrides("roberta", "mid")
    ]  # fmt: skip
    assert [(a, b) for a, b in zip(dense, masked, strict=True) if a != b] == [("false", "true")]
    assert flag(dense, "--masked_only_head") == "false" and flag(masked, "--masked_only_head") == "true"
    assert flag(masked, "--padding") == "packed" and flag(masked, "--max_seq_length") == "128"
    assert flag(masked, "--max_steps") == "7" and flag(masked, "--per_device_train_batch_size") == "4"
    assert flag(masked, "--tokenizer_name") == "/tok" and flag(masked, "--dataset") == "/c.txt"
    # The same vocabulary for every architecture: the tokenizer's, never an override.
    assert all("vocab_size" not in heads.config_overrides(n, s) for n in heads.ARCHITECTURES for s in heads.SIZES)
    assert heads.config_overrides("esm", "mid").endswith("position_embedding_type=rotary,token_dropout=true")


def test_an_architecture_that_needs_a_config_json_gets_one_and_the_others_scratch(tmp_path):
    from bench.heads_series import model_sources

    sources = model_sources(heads.HeadsSettings("cpu", architectures=["bert", "deberta-v2"]), tmp_path)
    assert sources["bert"] == "scratch:bert"
    written = json.loads((tmp_path / "heads-configs" / "deberta-v2.json").read_text(encoding="utf-8"))
    assert sources["deberta-v2"] == str(tmp_path / "heads-configs" / "deberta-v2.json")
    assert written == {"model_type": "deberta-v2", **heads.CONFIG_JSON_FIELDS["deberta-v2"]}


def test_the_report_lists_the_flags_with_placeholders():
    described = heads.describe_flags(heads.HeadsSettings("cpu", architectures=["albert", "bert"]))
    assert list(described) == ["dense", "masked-only"]
    for flags in described.values():
        assert flag(flags, "--model_name_or_path") == "<model>" and flag(flags, "--config_overrides") == "<overrides>"
        assert flag(flags, "--dataset") == "<corpus>" and flag(flags, "--tokenizer_name") == "<tokenizer>"


def test_runs_alternate_dense_and_masked_only_pair_after_pair_across_the_architectures():
    settings = heads.HeadsSettings("cpu", architectures=["bert", "esm"], pairs=2)
    assert heads.schedule(settings) == [
        (1, "bert", "dense"), (1, "bert", "masked-only"), (1, "esm", "dense"), (1, "esm", "masked-only"),
        (2, "bert", "dense"), (2, "bert", "masked-only"), (2, "esm", "dense"), (2, "esm", "masked-only"),
    ]  # fmt: skip


def test_unknown_names_and_too_few_steps_are_errors_that_say_what_is_known():
    with pytest.raises(ValueError, match="unknown architecture 'gpt2'; expected one of bert, roberta"):
        heads.check(heads.HeadsSettings("cpu", architectures=["bert", "gpt2"]))
    with pytest.raises(ValueError, match="unknown size 'large'; expected one of mid, base"):
        heads.check(heads.HeadsSettings("cpu", size="large"))
    with pytest.raises(ValueError, match="at least 2 steps"):
        heads.check(heads.HeadsSettings("cpu", max_steps=1))


def heads_run(name: str, rep: int, head: str, step_s: float) -> dict:
    """One run as bench/heads_series.py records it (run_once's figures, its recipe the head)."""
    return {**real_run("tiny", rep, head, 1000.0 / step_s), "architecture": name, "step_s": step_s}


RUNS = [
    heads_run("roberta", 1, "dense", 3.0),
    heads_run("roberta", 1, "masked-only", 1.5),
    heads_run("bert", 1, "dense", 2.0),
    heads_run("bert", 1, "masked-only", 1.6),
    heads_run("roberta", 2, "dense", 2.8),
    heads_run("roberta", 2, "masked-only", 2.0),
    heads_run("bert", 2, "dense", 2.2),  # an unfinished pair: no ratio
]


def test_step_seconds_come_from_the_timed_window():
    run = real_run("tiny", 1, "dense", 1.0)  # records.probe: 8 timed steps of 32 samples in 9 s
    assert heads.step_seconds(run) == pytest.approx(9 / 8)


def test_the_summary_takes_the_ratio_within_each_pair_and_counts_the_pairs_meeting_the_target():
    settings = heads.HeadsSettings("cpu", architectures=["bert", "roberta"])
    summary = heads.summarise(RUNS, settings)
    roberta, bert = summary["roberta"], summary["bert"]
    assert roberta["ratio"]["values"] == pytest.approx([2.0, 1.4])
    assert (roberta["ratio"]["min"], roberta["ratio"]["max"]) == pytest.approx((1.4, 2.0))
    assert roberta["target"] == 1.5 and roberta["pairs_meeting_target"] == 1
    assert roberta["heads"]["dense"]["step_s"] == {"min": 2.8, "median": 2.9, "max": 3.0}
    assert bert["ratio"]["values"] == pytest.approx([1.25]) and bert["target"] is None
    assert bert["heads"]["dense"]["step_s"]["max"] == 2.2  # the unfinished pair's run still counts for its head
    # The targets hold at the mid size on a CPU only.
    gpu = heads.summarise(RUNS, heads.HeadsSettings("cuda", architectures=["roberta"], size="base"))
    assert gpu["roberta"]["target"] is None


def test_the_heads_series_runs_only_when_asked_and_takes_its_options():
    assert "heads" not in selected_series(parse_args([]), "cpu")
    assert selected_series(parse_args(["--series", "heads"]), "cuda") == ["heads"]
    args = parse_args(["--heads-architectures", "roberta,modernbert", "--heads-pairs", "1", "--heads-steps", "3",
                       "--heads-batch", "4", "--real-corpus-mb", "1"])  # fmt: skip
    settings = heads_settings(args, "cpu")
    assert (settings.architectures, settings.pairs, settings.max_steps, settings.batch_size) == (
        ["roberta", "modernbert"], 1, 3, 4
    )  # fmt: skip
    assert (settings.corpus_mb, settings.size, settings.threads) == (1.0, "mid", 1)
    assert heads_settings(parse_args(["--heads-size", "mid"]), "cuda").size == "mid"
    with pytest.raises(ValueError, match="unknown architecture 'gpt2'"):
        heads_settings(parse_args(["--heads-architectures", "gpt2"]), "cpu")


def heads_report(
    settings: heads.HeadsSettings, runs: list, sources: dict, gpu: str | None = None, failures: tuple | list = ()
) -> str:
    """bench.heads_report.heads_markdown of a made-up result, as bench/heads_series.py puts it together."""
    return heads_markdown({
        "date": "2026-01-01T00:00:00+00:00",
        "environment": {"host": "h", "gpu": gpu, "cpu_count": 2, "torch": "t", "transformers": "x"},
        "settings": asdict(settings),
        "corpus": {"bytes": 8 * 2**20, "source": "docs", "lines": 10},
        "architectures": heads.describe_architectures(settings, sources),
        "flags": heads.describe_flags(settings),
        "failures": list(failures),
        "runs": runs,
        "summary": heads.summarise(runs, settings),
    })  # fmt: skip


def test_the_report_shows_each_heads_step_time_the_ratio_and_the_target():
    settings = heads.HeadsSettings("cpu", architectures=["roberta", "bert", "deberta-v2"], pairs=2)
    sources = {n: f"scratch:{n}" for n in settings.architectures} | {"deberta-v2": "/w/heads-configs/deberta-v2.json"}
    failures = [{"architecture": "esm", "pair": 1, "head": "dense", "error": "heads-1-esm-dense: exit 1\n..."}]
    text = heads_report(settings, RUNS, sources, failures=failures)
    assert "| roberta | 4.4 M | 2.800 – 3.000 | 1.500 – 2.000 | **1.70× [1.40 – 2.00]** | 2.00, 1.40 |" in text
    assert "≥ 1.5: met in 1 of 2 pair(s)" in text
    assert "| bert | 4.4 M | 2.000 – 2.200 | 1.600 – 1.600 | **1.25× [1.25 – 1.25]** | 1.25 | – |" in text
    assert "**esm** failed (pair 1, dense): heads-1-esm-dense: exit 1" in text
    assert "vocabulary 30,522" in text and "MFU" not in text
    assert "- **deberta-v2** (`deberta-v2.json`): DeBERTa-v3's" in text and '"pos_att_type": ["p2c", "c2p"]' in text
    assert "| deberta-v2 |" not in text  # no run: no row
    assert heads_run_line(RUNS[0]).startswith("heads roberta pair 1 dense: 3.000 s/step")


def test_on_a_gpu_the_report_gives_each_heads_mfu_but_none_for_albert():
    runs = [{**heads_run(n, 1, h, s), "mfu": m} for n in ("bert", "albert")
            for h, s, m in (("dense", 0.2, 0.30), ("masked-only", 0.1, 0.25))]  # fmt: skip
    settings = heads.HeadsSettings("cuda", architectures=["bert", "albert"], size="base", pairs=1)
    summary = heads.summarise(runs, settings)
    assert summary["bert"]["heads"]["dense"]["mfu"]["max"] == 0.30
    assert summary["albert"]["heads"]["dense"]["mfu"] is None  # bench/flops.py's rule does not hold for it
    text = heads_report(settings, runs, {n: f"scratch:{n}" for n in settings.architectures}, gpu="NVIDIA H200")
    assert "| MFU dense | MFU masked-only |" in text
    assert "| bert | 4.4 M | 0.200 – 0.200 | 0.100 – 0.100 | **2.00× [2.00 – 2.00]** | 2.00 | – | 30.0% – 30.0% | " \
        "25.0% – 25.0% |" in text  # fmt: skip
    assert "| albert | 4.4 M | 0.200 – 0.200 | 0.100 – 0.100 | **2.00× [2.00 – 2.00]** | 2.00 | – | – | – |" in text
    assert "NVIDIA H200" in text and "MFU = model FLOPs per token" in text
