"""Runs the time-to-quality series (its settings, flags, arithmetic and report: bench/quality.py): the real series'
corpus and tokenizer, a held-out file taken out of the training text, each system's training run with a checkpoint
every ``save_steps``, then one judge (``./entrypoint.sh evaluate``) over every checkpoint. run_mlm.py first, once at
each rate of its sweep (each final checkpoint judged; the best rate's run is the baseline), then our systems.

Results: ``bench/results/<date>-<host>-quality.json`` and ``.md``, and ``bench/results/latest-quality.md``; written
after each system is judged, so a time limit keeps what was measured.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import quality, real, report
from bench.packing import split_heldout
from bench.real_series import prepare_real, warm_run_mlm_cache
from bench.runner import ROOT, RunFailed, child_env, fresh_run_dir, result_header, warm_cache, write_results
from train.outputs.runfiles import COMPLETE_MARKER, is_checkpoint_name, step_of

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def results_stem(stem: str) -> str:
    """The quality series' result files sit beside the other series' of the same run, told apart by the suffix."""
    return f"{stem}-quality"


def prepare_quality(settings: quality.QualitySettings, workdir: Path) -> tuple[Path, Path, Path, dict[str, Any]]:
    """The real series' corpus and tokenizer, split into a training file and a held-out file (one line in each
    ``len / heldout`` stretch, every copy of it out of the training file): (train, held-out, tokenizer, facts)."""
    shared = real.RealSettings(settings.device, recipes=[], corpus_mb=settings.corpus_mb, threads=settings.threads)
    corpus, tokenizer_dir, facts = prepare_real(shared, workdir)
    lines = corpus.read_text(encoding="utf-8").splitlines()
    # Any line may be held out: the judge cuts each at max_seq_length, as training does.
    train_lines, heldout = split_heldout(lines, settings.heldout, lambda line: bool(line.strip()))
    train_file = workdir / f"quality-train-{corpus.stem}-{settings.heldout}.txt"
    heldout_file = workdir / f"quality-heldout-{corpus.stem}-{settings.heldout}.txt"
    for path, text in ((train_file, train_lines), (heldout_file, heldout)):
        body = "\n".join(text) + "\n"
        # Rewritten only when it changes: the caches are keyed by the file, and a reused workdir should hit them.
        if not path.exists() or path.read_text(encoding="utf-8") != body:
            path.write_text(body, encoding="utf-8")
    facts = {**facts, "train_lines": len(train_lines), "heldout_lines": len(heldout)}
    return train_file, heldout_file, tokenizer_dir, facts


def entrypoint_env(workdir: Path, threads: int | None, options: dict[str, str]) -> dict[str, str]:
    """What bench.runner.run_entrypoint gives a job (our options as MLM_* on child_env, this venv on PATH)."""
    env = child_env(workdir, threads, **{f"MLM_{name.upper()}": value for name, value in options.items()})
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def timed(command: list[str], env: dict[str, str], log_path: Path) -> tuple[float, float]:
    """One process to its exit, output to ``log_path``: (launch, exit) as time.time(), the launch taken right
    before the process starts, so a checkpoint's file times less it are seconds since launch."""
    with log_path.open("w", encoding="utf-8") as log:
        started = time.time()
        code = subprocess.call(command, cwd=ROOT, env=env, stdout=log, stderr=log)
        ended = time.time()
    if code != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise RunFailed(f"{command[-1]}: exit {code}; log {log_path}:\n{tail}")
    return started, ended


def train_system(
    name: str, settings: quality.QualitySettings, workdir: Path, files: tuple[Path, Path], rate: float
) -> tuple[Path, float, float]:
    """One system's training run from a fresh directory: (its output_dir, launch, exit). ``rate``: run_mlm.py's
    learning rate (the sweep's), or the baseline's best for our classic recipes."""
    train_file, tokenizer_dir = files
    directory = fresh_run_dir(workdir, f"quality-{name}-{rate:g}" if name == quality.REFERENCE else f"quality-{name}")
    directory.mkdir(parents=True)
    output = directory / "output"
    if name == quality.REFERENCE:
        argv = quality.run_mlm_flags(settings, str(train_file), str(tokenizer_dir), str(output), rate)
        backend = "gloo" if settings.device == "cpu" else "nccl"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                   "-m", "bench.run_mlm", *argv, "--ddp_backend", backend]  # fmt: skip
        env = child_env(workdir, settings.threads)
    else:
        options = quality.our_options(name, settings, str(train_file), str(tokenizer_dir), str(output), rate)
        command, env = [str(ROOT / "entrypoint.sh")], entrypoint_env(workdir, settings.threads, options)
    started, ended = timed(command, env, directory / "log.txt")
    return output, started, ended


def checkpoints(name: str, output: Path, launched: float) -> list[dict[str, Any]]:
    """Each checkpoint-N: its step, directory and seconds from launch to its completion (ours: the ``.complete``
    marker the job writes once a checkpoint is whole; run_mlm.py's stock Trainer has none, so its newest file,
    trainer_state.json being the Trainer's last write)."""
    found = []
    for path in sorted((p for p in output.iterdir() if is_checkpoint_name(p.name)), key=lambda p: step_of(p)):
        marker = path / COMPLETE_MARKER
        done = marker.stat().st_mtime if marker.exists() else max(f.stat().st_mtime for f in path.rglob("*"))
        found.append({"step": step_of(path), "path": str(path), "seconds": done - launched})
    return found


def with_tokenizer(checkpoint: Path, tokenizer_dir: Path) -> None:
    """A checkpoint the Trainer saved without its tokenizer gets the shared one (the judge names the shared one
    anyway; this keeps every checkpoint a whole model directory)."""
    if not (checkpoint / "tokenizer_config.json").exists():
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).exists():
                shutil.copy2(tokenizer_dir / name, checkpoint / name)


def judge(
    checkpoint: Path, label: str, workdir: Path, settings: quality.QualitySettings, files: tuple[Path, ...]
) -> float:
    """``./entrypoint.sh evaluate`` on one checkpoint: its judged held-out loss."""
    train_file, heldout_file, tokenizer_dir = files
    directory = fresh_run_dir(workdir, f"quality-judge-{label}")
    directory.mkdir(parents=True)
    output = directory / "output"
    options = quality.judge_options(
        str(checkpoint), str(train_file), str(heldout_file), str(tokenizer_dir), str(output)
    )
    timed([str(ROOT / "entrypoint.sh"), "evaluate"], entrypoint_env(workdir, settings.threads, options),
          directory / "log.txt")  # fmt: skip
    return float(json.loads((output / "eval_results.json").read_text(encoding="utf-8"))["eval_loss"])


def warm_caches(settings: quality.QualitySettings, workdir: Path, train_file: Path, tokenizer_dir: Path) -> None:
    """Every system's tokenization cache filled, as the real series does, so no timed run pays for tokenizing
    (a one-off per dataset, the same for both): the times are of training and saving."""
    scratch = str(workdir / "runs" / "quality-warm")
    for name in settings.systems:
        if name == quality.REFERENCE:
            flags = quality.run_mlm_flags(settings, str(train_file), str(tokenizer_dir), scratch, 1e-4)
            warm_run_mlm_cache(flags, workdir)  # the tokenized cache: the same at every rate
        else:
            warm_cache(
                quality.as_flags(quality.our_options(name, settings, str(train_file), str(tokenizer_dir), scratch))
            )


def run_quality_series(
    settings: quality.QualitySettings, workdir: Path, results_dir: Path, stem: str, tagged: bool
) -> None:
    """Every system's training run, one after the other, then the judge over each one's checkpoints; the results
    written after each system is judged, the report printed at the end."""
    quality.check(settings)
    log = report.progress
    log(
        f"bench quality: {settings.device}, {settings.model} model, {'/'.join(settings.systems)}, "
        f"{settings.max_steps} steps of {settings.batch_size}, a checkpoint every {settings.save_steps}; in {workdir}"
    )
    train_file, heldout_file, tokenizer_dir, facts = prepare_quality(settings, workdir)
    warm_caches(settings, workdir, train_file, tokenizer_dir)
    log(
        f"data: {facts['train_lines']:,} training lines, {facts['heldout_lines']:,} held out; tokenizer {tokenizer_dir}"
    )
    context = {
        **result_header(asdict(settings)),
        "corpus": facts,
        "model": real.MODELS[settings.model],
        "systems": {name: quality.SYSTEMS[name] for name in settings.systems},
        "tagged": tagged,
    }
    judged: dict[str, float] = {}  # checkpoint path -> its judged loss

    def judged_loss(path: str, label: str) -> float:
        if path not in judged:
            with_tokenizer(Path(path), tokenizer_dir)
            judged[path] = judge(Path(path), label, workdir, settings, (train_file, heldout_file, tokenizer_dir))
        return judged[path]

    # run_mlm.py at each rate of the sweep, its final checkpoint judged: the best rate's run is the baseline.
    sweep: dict[float, tuple[Path, float, float]] = {}
    finals: dict[float, float] = {}
    for rate in settings.baseline_rates:
        output, started, ended = train_system(quality.REFERENCE, settings, workdir, (train_file, tokenizer_dir), rate)
        sweep[rate] = (output, started, ended)
        final = checkpoints(quality.REFERENCE, output, started)[-1]
        finals[rate] = judged_loss(final["path"], f"{quality.REFERENCE}-{rate:g}-{final['step']}")
        log(f"quality run_mlm at learning rate {rate:g}: {ended - started:.1f} s, final judged loss {finals[rate]:.4f}")
    best = quality.best_rate(finals)
    context["sweep"] = {"finals": {f"{rate:g}": loss for rate, loss in finals.items()}, "best": f"{best:g}"}
    trained: dict[str, tuple[Path, float, float]] = {quality.REFERENCE: sweep[best]}
    for name in settings.systems:
        if name == quality.REFERENCE:
            continue
        output, started, ended = train_system(name, settings, workdir, (train_file, tokenizer_dir), best)
        trained[name] = (output, started, ended)
        log(f"quality {name}: trained in {ended - started:.1f} s (launch to exit)")
    curves: dict[str, list[dict[str, Any]]] = {}
    walls = {name: ended - started for name, (_, started, ended) in trained.items()}
    markdown = ""
    for name, (output, started, _) in trained.items():
        curves[name] = []
        for point in checkpoints(name, output, started):
            loss = judged_loss(point["path"], f"{name}-{point['step']}")
            curves[name].append({"step": point["step"], "seconds": point["seconds"], "loss": loss})
            log(f"quality {name} checkpoint-{point['step']}: {point['seconds']:.1f} s since launch, loss {loss:.4f}")
        result = {**context, "walls": walls, "curves": curves, "summary": quality.summarise(curves, walls)}
        markdown = quality.quality_markdown(result)
        write_results(results_dir, results_stem(stem), result, markdown, None if tagged else "latest-quality.md")
    print(markdown)
    log(f"bench quality: results in {results_dir / results_stem(stem)}.json and .md")
