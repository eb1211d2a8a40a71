"""bench/report.py: the two series' Markdown reports, from made-up results."""

from __future__ import annotations

from bench import real, report, startup
from bench.demo import PROPOSED_DEFAULTS, SMALL_MODEL
from bench.stats import METRICS, loss_agreement, run_metrics, spread
from tests.bench.records import RUNS, probe


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
        "summary": {"seed": {m: spread([run[m]]) for m in METRICS}},
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
