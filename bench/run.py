"""``make bench`` / ``python -m bench.run``: the seed recipe against our default recipe, same model, same data.

Each repetition runs the seed preset (configs/seed.yaml) and then our default recipe (no preset: the schema's
defaults plus the changes proposed in PROPOSED_DEFAULTS), each in a fresh ``torchrun`` process, alternating
A B A B so that load from other work on the machine hits both alike. Both train the same model from scratch
(on CPU a 2-layer DistilBERT with the real 30,522-token vocabulary; on a GPU the full-size DistilBERT) with the
same tokenizer on the same data (the seed's 50,000 demo samples) for the same number of steps.

Per run: real (non-padding) tokens/s and samples/s over the steady steps, wall time, time from process start to
the first optimizer step, peak memory (RSS on CPU, ``torch.cuda.max_memory_allocated`` on GPU), the loss curve,
and on a GPU the MFU (bench/flops.py). Then the ratios ours/seed per repetition with min/median/max, the two
loss curves side by side, and the tokenization time of the 50,000 samples cold and from the cache. Then the
start-up figures (bench/startup.py): importing the job and the launcher, and whole warm 2-step demo runs, against
a bare ``import torch, transformers, datasets`` measured alongside.
Results: ``bench/results/<date>-<host>.json`` and ``.md``, and ``bench/results/latest.md``.

The real-corpus series (``--series real``; on a CPU it runs after this one by default) compares our recipes with
transformers' run_mlm.py recipe on real text from this machine: see bench/real.py. Its results:
``bench/results/<date>-<host>-real.json`` and ``.md``, and ``bench/results/latest-real.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import real, report, startup
from bench.stats import loss_agreement, paired_ratios, run_metrics, spread
from train.config import JobArguments
from train.launch.decide import decide_pad_multiple

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SEED_PRESET = "configs/seed.yaml"
DEMO_PRESET = "configs/demo.yaml"

# What our defaults should be (proposed for train/config.py); the "ours" recipe passes them explicitly so the
# benchmark measures the proposal today and keeps measuring the same thing once they are the defaults.
PROPOSED_DEFAULTS: dict[str, str] = {"masked_only_head": "true"}

# The model both recipes train. scratch: because the hub is unreachable here and on the GPU machine; the real
# vocabulary size because the vocabulary projection is most of a small model's work.
SMALL_MODEL = "n_layers=2,dim=128,hidden_dim=512,n_heads=2,vocab_size=30522"
FULL_MODEL = "vocab_size=30522"  # DistilBERT's own sizes: 6 layers, dim 768, 66 M parameters


@dataclass
class Settings:
    device: str
    model_overrides: str
    repeats: int
    max_steps: int
    logging_steps: int
    eval_samples: int
    recipes: list[str]
    extras: list[str] = field(default_factory=list)
    packed_batch_size: int = 256
    extra_steps: int = 150
    threads: int | None = None  # OMP_NUM_THREADS of each run; None: as the launcher sets it (cores / processes)


def default_settings(device: str) -> Settings:
    if device == "cuda":
        return Settings("cuda", FULL_MODEL, repeats=2, max_steps=400, logging_steps=20, eval_samples=2048,
                        recipes=["seed", "ours"], extras=["packed", "ours-batch256", "packed-compile"])  # fmt: skip
    # A seed step of the small model takes seconds on a CPU (it projects 128 positions x 32 samples onto the
    # 30,522-token vocabulary), so a few steps per run keep `make bench` to minutes. One thread per run: on a
    # host shared with other work, OpenMP threads wait at every barrier for a descheduled sibling, which
    # multiplies the time of small operations (ours) far more than of large ones (the seed's) and turns the
    # figures into scheduler noise; --threads 0 measures with the launcher's setting instead.
    return Settings("cpu", SMALL_MODEL, repeats=3, max_steps=10, logging_steps=2, eval_samples=64,
                    recipes=["seed", "ours"], threads=1)  # fmt: skip


def recipe_flags(name: str, settings: Settings) -> list[str]:
    """The options that make a recipe; everything else is common to all runs."""
    gpu = settings.device == "cuda"
    # What the launcher hands the ranks: the seed preset keeps its fp16 on CUDA and loses it on CPU; our
    # default gets bf16 + tf32 on a GPU (Ampere and newer; every GPU in the peak table is), and on a CPU
    # padding to the longest sample (decide_pad_multiple).
    launcher = (
        ["--bf16", "true", "--tf32", "true"]
        if gpu
        else list(decide_pad_multiple(JobArguments.pad_to_multiple_of, None, True))
    )
    proposed = [arg for key, value in PROPOSED_DEFAULTS.items() for arg in (f"--{key}", value)]
    if name == "seed":
        return ["--config", SEED_PRESET] + ([] if gpu else ["--fp16", "false"])
    if name == "ours":
        return proposed + launcher
    if name == "current":  # the defaults as train/config.py has them now, without the proposals
        return launcher
    if name == "packed":  # one packed-128 run for MFU: full blocks, a batch large enough to fill the GPU
        return proposed + launcher + [
            "--padding", "packed", "--per_device_train_batch_size", str(settings.packed_batch_size),
            "--eval_strategy", "no", "--save_strategy", "no", "--dataloader_persistent_workers", "true",
        ]  # fmt: skip
    if name == "ours-batch256":  # throughput of our recipe with a batch that fills a GPU (a recipe change)
        return proposed + launcher + ["--per_device_train_batch_size", str(settings.packed_batch_size)]
    if name == "packed-compile":
        return recipe_flags("packed", settings) + ["--torch_compile", "true"]
    raise ValueError(f"unknown recipe {name!r}")


def schedule(settings: Settings) -> list[tuple[int, str]]:
    """(repetition, recipe) in run order: A B A B ..., so a burst of load elsewhere hits both recipes of a pair."""
    return [(rep, name) for rep in range(1, settings.repeats + 1) for name in settings.recipes]


def common_flags(settings: Settings, tokenizer_dir: Path, steps: int) -> list[str]:
    return [
        "--model_name_or_path", "scratch:distilbert", "--config_overrides", settings.model_overrides,
        "--tokenizer_name", str(tokenizer_dir), "--dataset", "demo", "--demo_samples", "50000",
        "--max_steps", str(steps), "--logging_steps", str(settings.logging_steps),
        "--max_eval_samples", str(settings.eval_samples), "--seed", "42", "--report_to", "none",
    ]  # fmt: skip


def child_env(workdir: Path, threads: int | None = None, **extra: str) -> dict[str, str]:
    """The environment of every run: the caller's minus its MLM_* options (they would change the recipes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLM_")}
    env.update(HF_HOME=str(workdir / "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    else:
        cores = len(os.sched_getaffinity(0))
        env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS") or str(cores)  # as the launcher sets it for 1 rank
    env.update(extra)
    return env


# --------------------------------------------------------------------------------------------------- preparation


def prepare(settings: Settings, workdir: Path) -> tuple[Path, dict[str, Any]]:
    """Train the tokenizer both recipes share, time tokenizing the 50,000 demo samples cold and again from the
    cache, and fill the runs' tokenization caches so no timed run pays for tokenizing."""
    os.environ["HF_HOME"] = str(workdir / "hf")  # before datasets/transformers are imported
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is built locally; never wait on a network
    from train.config import load_config
    from train.data import load_raw
    from train.model import train_wordpiece

    model = ["--model_name_or_path", "scratch:distilbert", "--config_overrides", settings.model_overrides]
    config = load_config(model, environ={})
    tokenizer_dir = workdir / "tokenizer"
    if not (tokenizer_dir / "tokenizer.json").exists():
        train_wordpiece(load_raw(config), config).save_pretrained(str(tokenizer_dir))

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
    from train.config import load_config
    from train.data import load_raw, tokenize
    from train.model import load_tokenizer

    home = workdir / "hf-tokenization"
    shutil.rmtree(home, ignore_errors=True)
    previous, os.environ["HF_HOME"] = os.environ["HF_HOME"], str(home)  # train.data reads it at each call
    try:
        config = load_config(argv, environ={})
        raw = load_raw(config)
        tokenizer = load_tokenizer(config, raw, from_scratch=True)
        started = time.perf_counter()
        splits = tokenize(config, raw, tokenizer)
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


def warm_cache(argv: list[str]) -> None:
    from train.config import load_config
    from train.data import load_raw, tokenize
    from train.model import load_tokenizer

    config = load_config(argv, environ={})
    raw = load_raw(config)
    tokenize(config, raw, load_tokenizer(config, raw, from_scratch=True))


# ---------------------------------------------------------------------------------------------------------- runs


class RunFailed(RuntimeError):
    pass


def run_once(
    name: str,
    argv: list[str],
    workdir: Path,
    label: str,
    *,
    device: str,
    threads: int | None,
    module: str = "bench.harness",
) -> dict[str, Any]:
    """One fresh torchrun process of ``module`` (bench.harness: train.job plus the probe; bench.run_mlm:
    run_mlm.py's recipe plus the same probe); its figures."""
    run_dir = workdir / "runs" / label
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    probe_file = run_dir / "probe.json"
    backend = "nccl" if device == "cuda" else "gloo"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
        "-m", module, *argv, "--output_dir", str(run_dir / "output"), "--ddp_backend", backend,
    ]  # fmt: skip
    load_before = os.getloadavg()[0]
    with open(run_dir / "log.txt", "w", encoding="utf-8") as log:
        started = time.time()
        code = subprocess.call(
            command,
            cwd=ROOT,
            env=child_env(workdir, threads, BENCH_PROBE_FILE=str(probe_file)),
            stdout=log,
            stderr=log,
        )
        ended = time.time()
    if code != 0 or not probe_file.exists():
        tail = (run_dir / "log.txt").read_text(encoding="utf-8", errors="replace")[-3000:]
        raise RunFailed(f"{label}: exit {code}; log {run_dir / 'log.txt'}:\n{tail}")
    probe = json.loads(probe_file.read_text(encoding="utf-8"))
    results_file = run_dir / "output" / "all_results.json"
    job_results = json.loads(results_file.read_text(encoding="utf-8")) if results_file.exists() else {}
    return {
        "recipe": name,
        "label": label,
        **run_metrics(probe, started, ended),
        "eval_loss": job_results.get("eval_loss"),
        "losses": probe["losses"],
        "load_avg_1m": [load_before, os.getloadavg()[0]],
        "probe": {k: v for k, v in probe.items() if k not in ("step_ends", "losses")},
    }


def demo_home(workdir: Path) -> Path:
    """The HF_HOME of the demo runs through entrypoint.sh: the first fills its caches, the start-up runs reuse them."""
    return workdir / "hf-entrypoint"


def first_step_cold(workdir: Path, threads: int | None) -> dict[str, Any]:
    """Seconds from starting the front door to the first optimizer step on the demo config with empty caches
    (tokenizer training and tokenization included), read off the logs (logging every step: the first step's record
    appears right after step 1). The warm figure is the start-up runs' (bench/startup.py), which reuse its caches."""
    home = demo_home(workdir)
    shutil.rmtree(home, ignore_errors=True)
    output = workdir / "runs" / "entrypoint-cold"
    shutil.rmtree(output, ignore_errors=True)
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


def demo_env(workdir: Path, threads: int | None, output: Path) -> dict[str, str]:
    """The 2-step demo run's environment."""
    return child_env(workdir, threads, MLM_CONFIG=DEMO_PRESET, MLM_MAX_STEPS="2", MLM_LOGGING_STEPS="1",
                     MLM_LOG_FORMAT="json", MLM_MAX_EVAL_SAMPLES="64", MLM_OUTPUT_DIR=str(output),
                     HF_HOME=str(demo_home(workdir)))  # fmt: skip


def measure_startup(workdir: Path, threads: int | None, repeats: int) -> dict[str, Any]:
    """bench/startup.py's figures: the imports against the bare ones, then whole warm demo runs."""

    def fresh_output(i: int) -> dict[str, str]:
        output = workdir / "runs" / f"startup-{i}"
        shutil.rmtree(output, ignore_errors=True)
        return demo_env(workdir, threads, output)

    return startup.measure(child_env(workdir, threads), ROOT, fresh_output, repeats)


# ------------------------------------------------------------------------------------------------------ summary


def summarise(runs: list[dict[str, Any]], settings: Settings) -> dict[str, Any]:
    metrics = ("real_tokens_per_s", "samples_per_s", "wall_s", "first_step_s", "peak_memory_bytes")
    by_recipe = {name: [r for r in runs if r["recipe"] == name] for name in dict.fromkeys(r["recipe"] for r in runs)}
    summary: dict[str, Any] = {
        name: {m: spread([r[m] for r in rs]) for m in metrics} for name, rs in by_recipe.items() if rs
    }
    for name, rs in by_recipe.items():
        if rs and rs[0]["mfu"] is not None:
            summary[name]["mfu"] = spread([r["mfu"] for r in rs])
    ratios: dict[str, Any] = {}
    seed = by_recipe.get("seed", [])
    for name in settings.recipes:
        if name == "seed" or not by_recipe.get(name) or not seed:
            continue
        ratios[name] = {}
        for metric in metrics:
            values = paired_ratios([r[metric] for r in by_recipe[name]], [r[metric] for r in seed])
            ratios[name][metric] = {**spread(values), "values": values}
    curves = {}
    if seed and by_recipe.get("ours"):
        curves = loss_agreement(seed[0]["losses"], by_recipe["ours"][0]["losses"])
    return {"summary": summary, "ratios": ratios, "loss_curves": curves}


def write_results(
    directory: Path, stem: str, context: dict[str, Any], runs: list[dict[str, Any]], settings: Settings
) -> str:
    """<stem>.json (everything), <stem>.md and, untagged, latest.md (the report); returns the report."""
    result = {**context, "runs": runs, **summarise(runs, settings)}
    markdown = report.markdown(result)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    (directory / f"{stem}.md").write_text(markdown, encoding="utf-8")
    if not context["tagged"]:  # latest.md is the newest run with the default settings
        (directory / "latest.md").write_text(markdown, encoding="utf-8")
    return markdown


# ------------------------------------------------------------------------------------------ real-corpus series

CORPUS_SOURCE = (
    "bench/corpus.py: prose lines of the documentation under /usr/share/doc and of the docstrings and comments of "
    "the installed Python packages, in a fixed order, repeated to the size"
)


def prepare_real(settings: real.RealSettings, workdir: Path) -> tuple[Path, Path, dict[str, Any]]:
    """The corpus, a 30,522-token WordPiece tokenizer trained on it, and every recipe's tokenization cache
    filled, so no timed run pays for tokenizing (outside the timed steps either way)."""
    os.environ["HF_HOME"] = str(workdir / "hf")  # before datasets/transformers are imported
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from bench.corpus import write_corpus
    from bench.data import train_tokenizer

    corpus = write_corpus(workdir / f"corpus-{settings.corpus_mb:g}mb.txt", int(settings.corpus_mb * 2**20))
    tokenizer_dir = train_tokenizer(corpus, workdir / f"tokenizer-{corpus.stem}")
    with corpus.open("rb") as lines:
        facts: dict[str, Any] = {
            "file": corpus.name,
            "bytes": corpus.stat().st_size,
            "lines": sum(1 for _ in lines),
            "source": CORPUS_SOURCE,
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

    from bench.run_mlm import parse, tokenized_train

    recipe, training = parse(argv + ["--output_dir", str(workdir / "runs" / "warm-run_mlm")])
    tokenized_train(recipe, AutoTokenizer.from_pretrained(recipe.tokenizer_name), training)


def write_real_results(
    directory: Path, stem: str, context: dict[str, Any], runs: list[dict[str, Any]], settings: real.RealSettings
) -> str:
    """<stem>-real.json and .md and, untagged, latest-real.md; returns the report."""
    result = {**context, "runs": runs, "summary": real.summarise(runs, settings)}
    markdown = report.real_markdown(result)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{stem}-real.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    (directory / f"{stem}-real.md").write_text(markdown, encoding="utf-8")
    if not context["tagged"]:
        (directory / "latest-real.md").write_text(markdown, encoding="utf-8")
    return markdown


def run_real_series(settings: real.RealSettings, workdir: Path, results_dir: Path, stem: str, tagged: bool) -> str:
    """Every model's recipes alternating, pair after pair; the results written after each complete pair, so a
    time limit keeps what was measured."""
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
    first = settings.models[0]
    context = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "environment": environment(),
        "settings": asdict(settings),
        "corpus": corpus_facts,
        "tokenizer_vocab": vocab,
        "models": {m: real.MODELS[m] for m in settings.models},
        "recipes": {
            name: {
                "module": real.recipe_module(name),
                "what": real.RECIPES[name],
                "flags": [
                    "<model>" if f == real.MODELS[first] else f
                    for f in real.recipe_flags(name, settings, first, "<corpus>", "<tokenizer>")
                ],
            }
            for name in settings.recipes
        },
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
    return markdown


def environment() -> dict[str, Any]:
    import torch
    import transformers

    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_count": os.cpu_count(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


SERIES = ("demo", "real")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--series",
        help="comma-separated: demo (seed vs ours on the demo data), real (ours vs run_mlm.py on real text, "
        "bench/real.py); default demo,real on CPU, demo on GPU (bench/gpu.sh's budget)",
    )
    parser.add_argument("--repeats", type=int, help="pairs of runs (seed, ours); default 3 on CPU, 2 on GPU")
    parser.add_argument("--max-steps", type=int, help="optimizer steps per run; default 10 on CPU, 400 on GPU")
    parser.add_argument(
        "--threads", type=int, help="OMP_NUM_THREADS per run; default 1 on CPU (see default_settings); 0: all cores"
    )
    parser.add_argument("--logging-steps", type=int, help="loss logged every N steps")
    parser.add_argument(
        "--recipes", help="comma-separated, alternated in this order: seed, ours, current (today's defaults)"
    )
    parser.add_argument(
        "--extras", help="single runs after the pairs: packed, ours-batch256, packed-compile (GPU default: all three)"
    )
    parser.add_argument("--extra-steps", type=int, help="steps of each extra run (default 150)")
    parser.add_argument(
        "--no-entrypoint", action="store_true", help="skip the demo config's first step and the start-up figures"
    )
    real_options = parser.add_argument_group("real-corpus series (bench/real.py)")
    real_options.add_argument(
        "--real-models",
        help=f"comma-separated: {', '.join(real.MODELS)} (default tiny; mid adds about 30 min on 2 cores)",
    )
    real_options.add_argument(
        "--real-recipes",
        help=f"comma-separated, alternated in this order; known: {', '.join(real.RECIPES)} "
        f"(default {','.join(real.DEFAULT_RECIPES)})",
    )
    real_options.add_argument("--real-pairs", type=int, help="repetitions of the recipes (default 3 on CPU)")
    real_options.add_argument("--real-steps", type=int, help="optimizer steps per run (default 20 on CPU)")
    real_options.add_argument("--real-batch", type=int, help="samples per step, every recipe (default 32)")
    real_options.add_argument("--real-corpus-mb", type=float, help="size of the real-text corpus in MiB (default 8)")
    parser.add_argument("--workdir", type=Path, help="caches and run outputs (default: a temporary directory)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--tag", help="suffix of the result files: <date>-<host>-<tag>.json")
    return parser.parse_args(argv)


def real_settings(args: argparse.Namespace, device: str) -> real.RealSettings:
    """The real series' defaults for the device, with what the command line sets (--threads applies to both)."""
    settings = real.default_real_settings(device)
    options = {
        "pairs": args.real_pairs, "max_steps": args.real_steps, "batch_size": args.real_batch,
        "corpus_mb": args.real_corpus_mb, "threads": args.threads, "logging_steps": args.logging_steps,
    }  # fmt: skip
    for name, value in options.items():
        if value is not None:
            setattr(settings, name, value)
    if args.real_models:
        settings.models = args.real_models.split(",")
    if args.real_recipes:
        settings.recipes = args.real_recipes.split(",")
    real.check(settings)
    return settings


def run_demo_series(args: argparse.Namespace, settings: Settings, workdir: Path, stem: str) -> str:
    """Seed vs ours on the demo data: pairs, then the extras; the results written after the pairs and each extra."""
    log = report.progress
    log(f"bench: {settings.device}, {settings.repeats} x {'/'.join(settings.recipes)}, {settings.max_steps} steps; "
        f"in {workdir}")  # fmt: skip
    tokenizer_dir, tokenization = prepare(settings, workdir)
    for padding, t in tokenization.items():
        log(f"tokenization ({padding}): {t['samples']} samples in {t['cold_s']:.1f} s, cached {t['cached_s']:.2f} s")
    entry = None if args.no_entrypoint else first_step_cold(workdir, settings.threads)
    if entry:
        log(f"demo config, first optimizer step via {entry['via']} with empty caches: {entry['cold_cache_s']:.1f} s")
    begins = None if args.no_entrypoint else measure_startup(workdir, settings.threads, settings.repeats)
    if begins:
        for row in begins["targets"]:
            log(f"start-up: {row['what']} = {row['ratio']:.2f} (target <= {row['target']:.1f})")

    context = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "environment": environment(),
        "settings": asdict(settings),
        "recipes": {n: recipe_flags(n, settings) for n in settings.recipes + settings.extras},
        "common_flags": common_flags(settings, Path("<tokenizer>"), settings.max_steps),
        "proposed_defaults": PROPOSED_DEFAULTS,
        "tokenization": tokenization,
        "first_step_demo": entry,
        "startup": begins,
        "tagged": bool(args.tag),
    }
    runs: list[dict[str, Any]] = []
    for rep, name in schedule(settings):
        argv = recipe_flags(name, settings) + common_flags(settings, tokenizer_dir, settings.max_steps)
        run = run_once(name, argv, workdir, f"{rep}-{name}", device=settings.device, threads=settings.threads)
        runs.append(run)
        log(report.run_line(rep, run))
    markdown = write_results(args.results_dir, stem, context, runs, settings)
    for name in settings.extras:  # written again after each, so a time limit there keeps what was measured
        argv = recipe_flags(name, settings) + common_flags(settings, tokenizer_dir, settings.extra_steps)
        try:
            run = run_once(name, argv, workdir, f"x-{name}", device=settings.device, threads=settings.threads)
        except RunFailed as exc:  # an extra must not cost the pairs' results
            log(f"extra run {name} failed: {exc}")
            continue
        runs.append(run)
        log(report.run_line(0, run))
        markdown = write_results(args.results_dir, stem, context, runs, settings)
    log(f"bench: results in {args.results_dir / stem}.json and .md")
    return markdown


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    series = args.series.split(",") if args.series else (["demo"] if device == "cuda" else list(SERIES))
    unknown = [s for s in series if s not in SERIES]
    if unknown:
        raise SystemExit(f"bench: unknown series {', '.join(unknown)}; expected {', '.join(SERIES)}")
    settings = default_settings(device)
    for name in ("repeats", "max_steps", "logging_steps", "extra_steps", "threads"):
        if getattr(args, name) is not None:
            setattr(settings, name, getattr(args, name))
    if args.recipes:
        settings.recipes = args.recipes.split(",")
    if args.extras is not None:
        settings.extras = [e for e in args.extras.split(",") if e]
    try:
        real_config = real_settings(args, device) if "real" in series else None
    except ValueError as exc:
        raise SystemExit(f"bench: {exc}") from None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mlm-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stem = f"{datetime.now(UTC):%Y-%m-%d}-{socket.gethostname()}" + (f"-{args.tag}" if args.tag else "")

    if "demo" in series:
        print(run_demo_series(args, settings, workdir, stem))
    if real_config is not None:
        print(run_real_series(real_config, workdir, args.results_dir, stem, bool(args.tag)))
        report.progress(f"bench real: results in {args.results_dir / stem}-real.json and .md")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RunFailed as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        sys.exit(1)
