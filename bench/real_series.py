"""Runs the real-corpus series (its models, recipes and summary: bench/real.py): the corpus of real text from
this machine, a tokenizer trained on it and every recipe's cache, then each model's recipes pair after pair.

Results: ``bench/results/<date>-<host>-real.json`` and ``.md``, and ``bench/results/latest-real.md``; written after
each complete pair, so a time limit keeps what was measured.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import real, report
from bench.corpus import SOURCE, write_corpus
from bench.data import train_tokenizer
from bench.runner import result_header, run_dir, run_once, use_local_hf, warm_cache, write_results


def results_stem(stem: str) -> str:
    """The real series' result files sit beside the demo series' of the same run, told apart by the suffix."""
    return f"{stem}-real"


def prepare_real(settings: real.RealSettings, workdir: Path) -> tuple[Path, Path, dict[str, Any]]:
    """The corpus, a 30,522-token WordPiece tokenizer trained on it, and every recipe's tokenization cache
    filled, so no timed run pays for tokenizing (outside the timed steps either way)."""
    use_local_hf(workdir)
    corpus = write_corpus(workdir / f"corpus-{settings.corpus_mb:g}mb.txt", int(settings.corpus_mb * 2**20))
    tokenizer_dir = train_tokenizer(corpus, workdir / f"tokenizer-{corpus.stem}")
    with corpus.open("rb") as lines:
        facts: dict[str, Any] = {
            "file": corpus.name,
            "bytes": corpus.stat().st_size,
            "lines": sum(1 for _ in lines),
            "source": SOURCE,
        }
    for name in settings.recipes:
        argv = real.recipe_flags(name, settings, settings.models[0], str(corpus), str(tokenizer_dir))
        if real.recipe_module(name) == "bench.run_mlm":
            warm_run_mlm_cache(argv, workdir)
        else:
            warm_cache(argv)
    return corpus, tokenizer_dir, facts


def warm_run_mlm_cache(argv: list[str], workdir: Path) -> None:
    """run_mlm.py's map caches, made here as its run will make them (a fresh tokenizer: calling one with
    truncation changes its state and so the cache's fingerprint)."""
    from transformers import AutoTokenizer

    # Not at the top: bench.run_mlm imports datasets, which reads HF_HOME at import; use_local_hf sets it first.
    from bench.run_mlm import parse, tokenized_train

    recipe, training = parse(argv + ["--output_dir", str(run_dir(workdir, "warm-run_mlm"))])
    tokenized_train(recipe, AutoTokenizer.from_pretrained(recipe.tokenizer_name), training)


def write_real_results(
    directory: Path, stem: str, context: dict[str, Any], runs: list[dict[str, Any]], settings: real.RealSettings
) -> str:
    """<stem>-real.json and .md and, untagged, latest-real.md; returns the report."""
    result = {**context, "runs": runs, "summary": real.summarise(runs, settings)}
    markdown = report.real_markdown(result)
    write_results(directory, results_stem(stem), result, markdown, None if context["tagged"] else "latest-real.md")
    return markdown


def run_real_series(settings: real.RealSettings, workdir: Path, results_dir: Path, stem: str, tagged: bool) -> None:
    """Every model's recipes alternating, pair after pair; the results written after each complete pair, so a
    time limit keeps what was measured; the report printed at the end."""
    real.check(settings)
    log = report.progress
    log(
        f"bench real: {settings.device}, models {'/'.join(settings.models)}, {settings.pairs} x "
        f"{'/'.join(settings.recipes)}, {settings.max_steps} steps of {settings.batch_size}; in {workdir}"
    )
    corpus, tokenizer_dir, corpus_facts = prepare_real(settings, workdir)
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    log(
        f"corpus: {corpus_facts['bytes'] / 2**20:.1f} MiB, {corpus_facts['lines']:,} lines; tokenizer: {vocab:,} tokens"
    )
    context = {
        **result_header(asdict(settings)),
        "corpus": corpus_facts,
        "tokenizer_vocab": vocab,
        "models": {m: real.MODELS[m] for m in settings.models},
        "recipes": real.describe_recipes(settings),
        "tagged": tagged,
    }
    runs: list[dict[str, Any]] = []
    markdown = ""
    for model, rep, name in real.schedule(settings):
        argv = real.recipe_flags(name, settings, model, str(corpus), str(tokenizer_dir))
        run = run_once(name, argv, workdir, f"real-{model}-{rep}-{name}", device=settings.device,
                       threads=settings.threads, module=real.recipe_module(name))  # fmt: skip
        run.update(model=model, rep=rep)
        runs.append(run)
        log(report.real_run_line(run))
        if name == settings.recipes[-1]:
            markdown = write_real_results(results_dir, stem, context, runs, settings)
    print(markdown)
    log(f"bench real: results in {results_dir / results_stem(stem)}.json and .md")
