"""bench/packing.py: the packing series' settings and command line, run flags and order, the held-out split and
evaluation (on a tiny model), the summary and the report. No run, no corpus."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from bench import heads, packing, packing_report
from bench.run import packing_settings, parse_args, selected_series
from tests.bench.records import flag, real_run

# ------------------------------------------------------------------------------------------- settings and flags


def test_the_packing_series_runs_only_when_asked_and_takes_its_options():
    assert "packing" not in selected_series(parse_args([]), "cpu")
    assert selected_series(parse_args(["--series", "packing"]), "cuda") == ["packing"]
    args = parse_args(["--packing-architectures", "bert,roberta", "--packing-modes", "packed,packed_crossing",
                       "--packing-repeats", "2", "--packing-steps", "4", "--packing-seeds", "5",
                       "--packing-quality-steps", "7", "--packing-heldout", "50", "--real-corpus-mb", "1"])  # fmt: skip
    settings = packing_settings(args, "cpu")
    assert (settings.architectures, settings.modes, settings.repeats, settings.max_steps) == (
        ["bert", "roberta"], ["packed", "packed_crossing"], 2, 4
    )  # fmt: skip
    assert (settings.seeds, settings.quality_steps, settings.heldout, settings.corpus_mb) == (5, 7, 50, 1.0)
    assert (settings.size, settings.blocks, settings.threads) == ("mid", 8, 1)  # the CPU defaults
    gpu = packing_settings(parse_args(["--series", "packing"]), "cuda")
    assert (gpu.size, gpu.blocks, gpu.threads) == ("base", 256, None)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--packing-architectures", "gpt2"], "unknown architecture 'gpt2'; expected one of bert, roberta"),
        (["--packing-architectures", "deberta-v2"], "unknown architecture 'deberta-v2'"),  # eager only: left out
        (["--packing-modes", "packed,crossing"], "unknown padding mode 'crossing'; expected one of packed, "),
        (["--packing-modes", "packed,packed"], "padding modes named twice: packed,packed"),
        (["--packing-modes", "packed,dynamic"], "the quality runs compare packed with packed_crossing"),
        (["--packing-steps", "1"], "at least 2 steps"),
        (["--packing-heldout", "0"], "heldout must be at least 1, not 0"),
        (["--packing-seeds", "-1"], "seeds must be at least 0"),
    ],
)
def test_bad_settings_are_errors_that_say_what_is_known(argv, message):
    with pytest.raises(ValueError, match=message):
        packing_settings(parse_args(argv), "cpu")


def test_no_seeds_means_no_quality_runs_and_then_any_modes_will_do():
    settings = packing_settings(parse_args(["--packing-modes", "dynamic,padding_free", "--packing-seeds", "0"]), "cpu")
    assert packing.quality_schedule(settings) == []


def test_a_speed_run_is_the_heads_series_masked_only_run_with_another_padding_and_batch():
    settings = packing.PackingSettings("cpu", max_steps=7)
    argv = packing.run_flags("roberta", "padding_free", settings, "/c.txt", "/tok", batch=51)
    shape = heads.HeadsSettings("cpu", max_steps=7, batch_size=51)
    masked_only = heads.run_flags("roberta", "masked-only", shape, "/c.txt", "/tok", "scratch:roberta")
    assert [(a, b) for a, b in zip(argv, masked_only, strict=True) if a != b] == [("padding_free", "packed")]
    assert flag(argv, "--masked_only_head") == "true" and flag(argv, "--per_device_train_batch_size") == "51"


def test_a_quality_run_changes_only_its_seed_steps_and_learning_rate():
    settings = packing.PackingSettings("cpu", max_steps=10, quality_steps=60, learning_rate=5e-4, warmup_steps=6)
    speed = packing.run_flags("bert", "packed_crossing", settings, "/c.txt", "/tok", batch=8)
    quality = packing.run_flags("bert", "packed_crossing", settings, "/c.txt", "/tok", batch=8, seed=44)
    assert flag(quality, "--seed") == "44" and flag(quality, "--max_steps") == "60"
    assert flag(quality, "--learning_rate") == "0.0005" and flag(quality, "--warmup_steps") == "6"
    pairs = dict(zip(quality[::2], quality[1::2], strict=True))
    changed = {"--seed", "--max_steps", "--learning_rate", "--warmup_steps"}
    assert {k: v for k, v in pairs.items() if k not in changed} == {
        k: v for k, v in zip(speed[::2], speed[1::2], strict=True) if k not in changed
    }
    described = packing.describe_flags(settings)
    assert list(described) == [*packing.MODES, "quality runs, beside those"]
    assert flag(described["dynamic"], "--per_device_train_batch_size") == "<batch>"
    assert described["quality runs, beside those"] == [
        "--max_steps 60", "--learning_rate 0.0005", "--warmup_steps 6"
    ]  # fmt: skip


def test_replacing_a_flag_that_is_not_there_is_an_error():
    assert packing.replace_flags(["--a", "1", "--b", "2"], {"--b": "3"}) == ["--a", "1", "--b", "3"]
    with pytest.raises(ValueError, match="flags not in the run's arguments: --c"):
        packing.replace_flags(["--a", "1"], {"--c": "2"})


def test_the_unpacked_modes_get_as_many_real_tokens_a_step_as_the_packed_ones():
    settings = packing.PackingSettings("cpu", blocks=8)
    assert packing.examples_per_step("packed", settings, 20.1) == 8
    assert packing.examples_per_step("packed_crossing", settings, 20.1) == 8
    assert packing.examples_per_step("dynamic", settings, 20.1) == 51  # 1,024 / 20.1
    assert packing.examples_per_step("padding_free", settings, 2000.0) == 1  # never none
    with pytest.raises(ValueError, match="the corpus has no tokens"):
        packing.examples_per_step("dynamic", settings, 0.0)


def test_speed_runs_alternate_the_modes_repeat_after_repeat_and_quality_runs_seed_after_seed():
    settings = packing.PackingSettings("cpu", architectures=["bert"], modes=["packed", "dynamic"], repeats=2, seeds=2)
    assert packing.speed_schedule(settings) == [
        (1, "bert", "packed"), (1, "bert", "dynamic"), (2, "bert", "packed"), (2, "bert", "dynamic")
    ]  # fmt: skip
    assert packing.quality_schedule(settings) == [
        (42, "bert", "packed"), (42, "bert", "packed_crossing"), (43, "bert", "packed"), (43, "bert", "packed_crossing")
    ]  # fmt: skip


# --------------------------------------------------------------------------------------------- held-out split


def test_held_out_documents_are_spread_over_the_corpus_and_never_trained_on():
    lines = [f"line {i}" for i in range(100)] + ["line 0", "line 10"]  # repeated lines: every copy goes
    train, heldout = packing.split_heldout(lines, 10, fits=lambda line: True)
    assert heldout == [f"line {i}" for i in range(0, 100, 10)]
    assert not set(heldout) & set(train) and len(train) == 90


def test_a_held_out_document_too_long_to_evaluate_whole_is_replaced_by_its_neighbour():
    lines = [f"line {i}" for i in range(20)]
    _, heldout = packing.split_heldout(lines, 2, fits=lambda line: line not in ("line 0", "line 10"))
    assert heldout == ["line 1", "line 11"]
    with pytest.raises(ValueError, match="only 0 of 2 stretches"):
        packing.split_heldout(lines, 2, fits=lambda line: False)
    with pytest.raises(ValueError, match="11 held-out documents asked of a corpus of 20 distinct lines"):
        packing.split_heldout(lines, 11, fits=lambda line: True)


# ------------------------------------------------------------------------------------------ held-out evaluation

WORDS = "the cat sat on a mat and dog ran far away from home".split()


@pytest.fixture(scope="module")
def tiny():
    """A word-level tokenizer with BERT's specials and template, and a 1-layer BERT on it (dropout on: the
    evaluation must turn it off)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]",
                                        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")  # fmt: skip
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64, pad_token_id=0)  # fmt: skip
    return tokenizer, BertForMaskedLM(config).train()


DOCUMENTS = ["the cat sat on a mat", "a dog ran far away from home", "the dog sat", "the cat ran away from the dog",
             "a mat", "the cat sat on the dog and the dog ran far away from home and the cat sat on a mat"]  # fmt: skip


def alone(model, tokenizer, documents, seed):
    """The reference: one forward per document, with the masks the job's collator draws for its index."""
    import torch

    from train.model.collator import IGNORE_INDEX, MaskingCollator

    collator = MaskingCollator(tokenizer.pad_token_id, tokenizer.mask_token_id, len(tokenizer), seed=seed,
                               mlm_probability=0.15, pad_to_multiple_of=None)  # fmt: skip
    model.eval()
    total, count = 0.0, 0
    for index, text in enumerate(documents):
        encoded = tokenizer(text, return_special_tokens_mask=True)
        batch = collator([{"input_ids": encoded["input_ids"], "special_tokens_mask": encoded["special_tokens_mask"],
                           "sample_index": index}])  # fmt: skip
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"]).logits
        chosen = batch["labels"] != IGNORE_INDEX
        total += float(torch.nn.functional.cross_entropy(logits[chosen], batch["labels"][chosen], reduction="sum"))
        count += int(chosen.sum())
    return total / count, count


def test_the_held_out_loss_is_each_documents_loss_alone_with_masks_fixed_by_the_seed(tiny):
    tokenizer, model = tiny
    documents = DOCUMENTS * 4  # 24 documents, two of several lengths: batched by length, each row one document
    scored = packing.heldout_loss(model, tokenizer, documents, batch_size=3)
    expected, masked = alone(model, tokenizer, documents, packing.EVAL_SEED)
    assert scored["masked_tokens"] == masked > 0
    assert scored["loss"] == pytest.approx(expected, rel=1e-5)
    assert scored["documents"] == 24 and scored["tokens"] == sum(len(d.split()) + 2 for d in documents)
    assert packing.heldout_loss(model, tokenizer, documents)["loss"] == pytest.approx(scored["loss"], rel=1e-5)
    assert packing.heldout_loss(model, tokenizer, documents, seed=1)["loss"] != pytest.approx(scored["loss"])


def test_the_held_out_evaluation_refuses_what_it_cannot_score_whole(tiny):
    tokenizer, model = tiny
    with pytest.raises(ValueError, match="no held-out documents"):
        packing.heldout_loss(model, tokenizer, [])
    with pytest.raises(ValueError, match=r"1 held-out document\(s\) longer than 9 tokens \(first: #5\)"):
        packing.heldout_loss(model, tokenizer, DOCUMENTS, max_length=9)
    with pytest.raises(ValueError, match="no token of the 1 held-out document"):
        packing.heldout_loss(model, tokenizer, ["a"], mlm_probability=1e-9)


# ------------------------------------------------------------------------------------------ summary and report


def speed_run(rep: int, mode: str, tokens_per_s: float, efficiency: float = 1.0) -> dict:
    """One speed run as bench/packing_series.py records it."""
    run = real_run("tiny", rep, mode, tokens_per_s)
    return {**run, "architecture": "bert", "label": f"packing-{rep}-bert-{mode}", "load_avg_1m": [1.0, 3.2],
            "packing": {"padding": mode, "efficiency": efficiency}}  # fmt: skip


def quality_run(seed: int, mode: str, loss: float) -> dict:
    return {**speed_run(seed, mode, 900.0), "seed": seed, "label": f"packing-seed{seed}-bert-{mode}",
            "heldout": {"loss": loss, "masked_tokens": 2800, "documents": 1000, "tokens": 20000}}  # fmt: skip


RUNS = [
    speed_run(1, "packed", 800.0), speed_run(1, "packed_crossing", 1000.0), speed_run(1, "dynamic", 100.0, 0.7),
    speed_run(1, "padding_free", 400.0),
    speed_run(2, "packed", 900.0), speed_run(2, "packed_crossing", 900.0), speed_run(2, "dynamic", 150.0, 0.7),
    speed_run(3, "packed", 700.0),  # an unfinished repeat: in the figures, in no ratio
]  # fmt: skip
QUALITY = [quality_run(42, "packed", 7.50), quality_run(42, "packed_crossing", 7.60),
           quality_run(43, "packed", 7.40), quality_run(43, "packed_crossing", 7.35),
           quality_run(44, "packed", 7.45)]  # fmt: skip
LAYOUT = {
    "packed": {"batch": 8, "examples": 100, "tokens_per_example": 128.0, "train_tokens": 12800, "tokens_cut": 0,
               "efficiency": 1.0, "samples": 100, "tokens_kept": 0.997},
    "packed_crossing": {"batch": 8, "examples": 100, "tokens_per_example": 128.0, "train_tokens": 12800,
                        "tokens_cut": 0, "efficiency": 1.0, "samples": 100, "tokens_kept": 0.997},
    "dynamic": {"batch": 51, "examples": 600, "tokens_per_example": 20.1, "train_tokens": 12000, "tokens_cut": 9,
                "efficiency": 0.27, "samples": 600, "tokens_kept": 0.9999},
    "padding_free": {"batch": 51, "examples": 600, "tokens_per_example": 20.1, "train_tokens": 12000,
                     "tokens_cut": 9, "efficiency": 0.94, "samples": 600, "tokens_kept": 0.9999},
}  # fmt: skip


def test_the_summary_takes_ratios_within_a_repeat_and_checks_the_efficiency_targets():
    settings = packing.PackingSettings("cpu")
    summary = packing_report.summarise(RUNS, QUALITY, LAYOUT, settings)
    efficiency = summary["efficiency"]
    assert (efficiency["packed"]["target"], efficiency["packed"]["met"]) == (0.95, True)
    assert (efficiency["padding_free"]["target"], efficiency["padding_free"]["met"]) == (1.0, False)
    assert efficiency["dynamic"]["target"] is None and efficiency["dynamic"]["met"] is None
    bert = summary["architectures"]["bert"]
    ratios = {r["label"]: r["values"] for r in bert["ratios"]}
    assert ratios["documents apart (packed / packed_crossing)"] == pytest.approx([0.8, 1.0])
    assert ratios["packed / dynamic"] == pytest.approx([8.0, 6.0])
    assert ratios["padding_free / packed"] == pytest.approx([0.5])  # repeat 2 has no padding-free run
    assert bert["modes"]["packed"]["real_tokens_per_s"] == {"min": 700.0, "median": 800.0, "max": 900.0}
    assert bert["modes"]["dynamic"]["banner_efficiency"]["max"] == 0.7
    quality = bert["quality"]
    assert [row["seed"] for row in quality["seeds"]] == [42, 43]  # seed 44 has no crossing run yet
    assert quality["difference"]["values"] == pytest.approx([0.10, -0.05])
    assert quality["isolated_lower"] == 1 and quality["crossing"]["max"] == pytest.approx(7.60)


def report(runs, quality, failures=()) -> str:
    settings = packing.PackingSettings("cpu")
    return packing_report.markdown({
        "date": "2026-01-01T00:00:00+00:00",
        "environment": {"host": "h", "gpu": None, "cpu_count": 2, "torch": "t", "transformers": "x"},
        "settings": asdict(settings),
        "corpus": {"bytes": 8 * 2**20, "source": "docs", "lines": 10},
        "tokenizer_vocab": 30522,
        "heldout": {"documents": 1000, "tokens": 20000, "eval_seed": 0},
        "architectures": {"bert": heads.config_overrides("bert", "mid")},
        "flags": packing.describe_flags(settings),
        "failures": list(failures),
        "runs": runs,
        "quality_runs": quality,
        "summary": packing_report.summarise(runs, quality, LAYOUT, settings),
    })  # fmt: skip


def test_the_report_shows_the_efficiency_the_ratios_and_the_held_out_losses():
    failures = [{"architecture": "bert", "mode": "padding_free", "label": "packing-2-bert-padding_free",
                 "error": "packing-2-bert-padding_free: exit 1\nlog..."}]  # fmt: skip
    text = report(RUNS, QUALITY, failures)
    assert "| packed | 128-token blocks" in text and "| 8 | 128.0 | **100.0%** (100 samples) |" in text
    assert "| ≥ 95%: met | 99.7% |" in text and "≥ 100%: **not met**" in text
    assert "| dynamic |" in text and "**27.0%** (600 samples) | 70.0% – 70.0% | – |" in text
    assert "| documents apart (packed / packed_crossing) | **0.90× [0.80 – 1.00]** | 0.80, 1.00 |" in text
    assert "| 42 | 7.5000 | 7.6000 | +0.1000 |" in text and "| 43 | 7.4000 | 7.3500 | -0.0500 |" in text
    assert "**-0.0500 – +0.1000**" in text and "Isolated lower in 1 of 2 seed(s)." in text
    assert "isolated / crossing over 50 steps: **1.00× [1.00 – 1.00]** (per seed: 1.00, 1.00)" in text
    assert "**bert padding_free** failed (packing-2-bert-padding_free): packing-2-bert-padding_free: exit 1" in text
    assert "The machine was shared" in text and "up to 3.2" in text  # the runs' load averages say so
    assert "| packing-seed44-bert-packed | packed | 32 |" in text and "| 7.4500 |" in text
    assert "- **bert**: `--model_name_or_path scratch:bert --config_overrides num_hidden_layers=6," in text
    assert packing_report.run_line(QUALITY[0]).startswith("packing packing-seed42-bert-packed: 900 real tokens/s")


def test_an_idle_machine_is_said_to_be_idle_and_a_report_without_runs_still_renders():
    quiet = [{**r, "load_avg_1m": [1.0, 1.2]} for r in RUNS]
    assert "otherwise idle" in report(quiet, [])
    text = report([], [])
    assert "## bert (no run)" in text and "held-out loss on whole documents" not in text
