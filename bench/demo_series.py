"""Runs the demo series (its settings, recipes and summary: bench/demo.py): the shared tokenizer and caches, the
tokenization timings, the demo config's cold first step and the start-up figures, then the pairs and the extras.

Results: ``bench/results/<date>-<host>.json`` and ``.md``, and ``bench/results/latest.md``; written after the pairs
and again after each extra run, so a time limit keeps what was measured.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import report, startup
from bench.demo import (
    DEMO_PRESET,
    PROPOSED_DEFAULTS,
    DemoSettings,
    common_flags,
    recipe_flags,
    schedule,
    summarise,
)
from bench.runner import (
    ROOT,
    RunFailed,
    child_env,
    fresh_run_dir,
    result_header,
    run_once,
    use_local_hf,
    warm_cache,
    write_results,
)
from train.config import load_config


def prepare(settings: DemoSettings, workdir: Path) -> tuple[Path, dict[str, Any]]:
    """Train the tokenizer both recipes share, time tokenizing the 50,000 demo samples cold and again from the
    cache, and fill the runs' tokenization caches so no timed run pays for tokenizing."""
    use_local_hf(workdir)
    # After use_local_hf: these import datasets, which reads HF_HOME at import (bench.run imports this module first).
    from train.data import load_raw
    from train.model.tokenizer_training import train_tokenizer

    model = ["--model_name_or_path", "scratch:distilbert", "--recipe", "classic", "--config_overrides",
             settings.model_overrides]  # fmt: skip  # as the runs get them (bench/demo.py's common_flags)
    config = load_config(model, environ={})
    tokenizer_dir = workdir / "tokenizer"
    if not (tokenizer_dir / "tokenizer.json").exists():
        train_tokenizer(load_raw(config.data, config.training), config.model, config.data).save_pretrained(
            str(tokenizer_dir)
        )

    tokenization = {
        padding: time_tokenization(workdir, model + ["--tokenizer_name", str(tokenizer_dir), "--padding", padding])
        for padding in ("max_length", "dynamic")
    }
    for name in settings.recipes + settings.extras:
        warm_cache(recipe_flags(name, settings) + common_flags(settings, tokenizer_dir, settings.max_steps))
    return tokenizer_dir, tokenization


def time_tokenization(workdir: Path, argv: list[str]) -> dict[str, Any]:
    """Tokenize the whole demo set (50,000 samples, both splits) into an empty cache, then again in a fresh
    process, as a second run of the job would: it must read everything from the cache (bench/tokenization.py)."""
    # Not at the top: these import datasets, which reads HF_HOME at import; prepare's use_local_hf sets it first.
    from train.data import load_raw, tokenize
    from train.model.load import load_tokenizer, scratch_config

    home = workdir / "hf-tokenization"
    shutil.rmtree(home, ignore_errors=True)
    previous, os.environ["HF_HOME"] = os.environ["HF_HOME"], str(home)  # train.data reads it at each call
    try:
        config = load_config(argv, environ={})
        raw = load_raw(config.data, config.training)
        tokenizer = load_tokenizer(config.model, config.data, raw, scratch_config(config.model))
        started = time.perf_counter()
        splits = tokenize(config.data, raw, tokenizer)
        cold = time.perf_counter() - started
    finally:
        os.environ["HF_HOME"] = previous
    done = subprocess.run(
        [sys.executable, "-m", "bench.tokenization", *argv],
        cwd=ROOT,
        env=child_env(workdir, HF_HOME=str(home)),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RunFailed(f"tokenization: exit {done.returncode}:\n{done.stderr[-3000:]}")
    second = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "samples": sum(len(split) for split in splits.values()),
        "cold_s": cold,
        "cached_s": second["seconds"],
        "cache_hit": second["cache_files_before"] > 0 and not second["files_written"],
        "cache_files": second["cache_files_before"],
    }


# ------------------------------------------------------------------------------- the front door: entrypoint.sh


def demo_home(workdir: Path) -> Path:
    """The HF_HOME of the demo runs through entrypoint.sh: the first fills its caches, the start-up runs reuse them."""
    return workdir / "hf-entrypoint"


def demo_env(workdir: Path, threads: int | None, output: Path) -> dict[str, str]:
    """The 2-step demo run's environment."""
    return child_env(workdir, threads, MLM_CONFIG=DEMO_PRESET, MLM_MAX_STEPS="2", MLM_LOGGING_STEPS="1",
                     MLM_LOG_FORMAT="json", MLM_MAX_EVAL_SAMPLES="64", MLM_OUTPUT_DIR=str(output),
                     HF_HOME=str(demo_home(workdir)))  # fmt: skip


def first_step_cold(workdir: Path, threads: int | None) -> dict[str, Any]:
    """Seconds from starting the front door to the first optimizer step on the demo config with empty caches
    (tokenizer training and tokenization included), read off the logs (logging every step: the first step's record
    appears right after step 1). The warm figure is the start-up runs' (bench/startup.py), which reuse its caches."""
    shutil.rmtree(demo_home(workdir), ignore_errors=True)
    output = fresh_run_dir(workdir, "entrypoint-cold")
    started = time.perf_counter()
    first = None
    lines: list[str] = []
    # Its own session, so that once the first step is seen the whole tree (launcher, torchrun, rank, dataloader
    # workers) is stopped at once instead of finishing, evaluating and saving.
    with subprocess.Popen(
        ["./entrypoint.sh"], cwd=ROOT, env=demo_env(workdir, threads, output), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True,
    ) as process:  # fmt: skip
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if startup.log_record(line).get("event") == "train":  # as the warm runs read it
                first = time.perf_counter() - started
                os.killpg(process.pid, signal.SIGKILL)
                break
        code = process.wait()
    if first is None:
        raise RunFailed(f"demo via entrypoint.sh: exit {code} before a first step:\n{''.join(lines[-30:])}")
    return {"via": "entrypoint.sh", "cold_cache_s": first}


def measure_startup(workdir: Path, threads: int | None, repeats: int) -> dict[str, Any]:
    """bench/startup.py's figures: the imports against the bare ones, then whole warm demo runs."""

    def fresh_output(i: int) -> dict[str, str]:
        return demo_env(workdir, threads, fresh_run_dir(workdir, f"startup-{i}"))

    return startup.measure(child_env(workdir, threads), ROOT, fresh_output, repeats)


# ---------------------------------------------------------------------------------------------------- the series


def write(
    directory: Path, stem: str, context: dict[str, Any], runs: list[dict[str, Any]], settings: DemoSettings
) -> str:
    """<stem>.json and .md and, untagged, latest.md: the runs so far, their summary and the report; returns the
    report."""
    result = {**context, "runs": runs, **summarise(runs, settings)}
    markdown = report.markdown(result)
    write_results(directory, stem, result, markdown, None if context["tagged"] else "latest.md")
    return markdown


def run_demo_series(
    settings: DemoSettings, workdir: Path, results_dir: Path, stem: str, *, tagged: bool, entrypoint: bool
) -> None:
    """Seed vs ours on the demo data: pairs, then the extras; the results written after the pairs and each extra,
    the report printed at the end. ``entrypoint``: also the demo config's cold first step and the start-up
    figures."""
    log = report.progress
    log(f"bench: {settings.device}, {settings.repeats} x {'/'.join(settings.recipes)}, {settings.max_steps} steps; "
        f"in {workdir}")  # fmt: skip
    tokenizer_dir, tokenization = prepare(settings, workdir)
    for padding, t in tokenization.items():
        log(f"tokenization ({padding}): {t['samples']} samples in {t['cold_s']:.1f} s, cached {t['cached_s']:.2f} s")
    entry = first_step_cold(workdir, settings.threads) if entrypoint else None
    if entry:
        log(f"demo config, first optimizer step via {entry['via']} with empty caches: {entry['cold_cache_s']:.1f} s")
    begins = measure_startup(workdir, settings.threads, settings.repeats) if entrypoint else None
    if begins:
        for row in begins["targets"]:
            log(f"start-up: {row['what']} = {row['ratio']:.2f} (target <= {row['target']:.1f})")

    context = {
        **result_header(asdict(settings)),
        "recipes": {n: recipe_flags(n, settings) for n in settings.recipes + settings.extras},
        "common_flags": common_flags(settings, Path("<tokenizer>"), settings.max_steps),
        "proposed_defaults": PROPOSED_DEFAULTS,
        "tokenization": tokenization,
        "first_step_demo": entry,
        "startup": begins,
        "tagged": tagged,
    }
    runs: list[dict[str, Any]] = []
    for rep, name in schedule(settings):
        argv = recipe_flags(name, settings) + common_flags(settings, tokenizer_dir, settings.max_steps)
        run = run_once(name, argv, workdir, f"{rep}-{name}", device=settings.device, threads=settings.threads)
        runs.append(run)
        log(report.run_line(rep, run))
    markdown = write(results_dir, stem, context, runs, settings)
    for name in settings.extras:  # written again after each, so a time limit there keeps what was measured
        argv = recipe_flags(name, settings) + common_flags(settings, tokenizer_dir, settings.extra_steps)
        try:
            run = run_once(name, argv, workdir, f"x-{name}", device=settings.device, threads=settings.threads)
        except RunFailed as exc:  # an extra must not cost the pairs' results
            log(f"extra run {name} failed: {exc}")
            continue
        runs.append(run)
        log(report.run_line(0, run))
        markdown = write(results_dir, stem, context, runs, settings)
    log(f"bench: results in {results_dir / stem}.json and .md")
    print(markdown)
