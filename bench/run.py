"""``make bench`` / ``python -m bench.run``: the seed recipe against our default recipe, same model, same data.

The command line of the series; it runs the selected ones one after the other, each printing its report:

- the demo series (``--series demo``): the seed preset against our default recipe on the seed's 50,000 demo
  samples, then the start-up figures; bench/demo.py (settings, recipes, summary) and bench/demo_series.py (the
  runs). Results: ``bench/results/<date>-<host>.json`` and ``.md``, and ``bench/results/latest.md``.
- the real-corpus series (``--series real``; on a CPU it runs after the demo series by default): our recipes
  against transformers' run_mlm.py recipe on real text from this machine; bench/real.py and bench/real_series.py.
  Results: ``bench/results/<date>-<host>-real.json`` and ``.md``, and ``bench/results/latest-real.md``.
- the heads series (``--series heads``; only when asked: about 30 minutes on 2 cores): the masked-only head
  against the dense head of the same model, per architecture, on the real series' text; bench/heads.py and
  bench/heads_series.py. Results: ``bench/results/<date>-<host>-heads.json`` and ``.md``, and
  ``bench/results/latest-heads.md``.
- the packing series (``--series packing``; only when asked: about 18 minutes on 2 cores): the padding modes'
  efficiency, speed, and the held-out loss of documents kept apart against attending across, on the real series'
  text; bench/packing.py and bench/packing_series.py. Results: ``bench/results/<date>-<host>-packing.json`` and
  ``.md``, and ``bench/results/latest-packing.md``.
- the quality series (``--series quality``; on a CPU it runs after the real series by default: about 15
  minutes on 2 cores): time to quality, from launch, against transformers' run_mlm.py recipe: every checkpoint
  of each judged by ``./entrypoint.sh evaluate`` on the same held-out text and masks; bench/quality.py and
  bench/quality_series.py.
  Results: ``bench/results/<date>-<host>-quality.json`` and ``.md``, and ``bench/results/latest-quality.md``.
- the memory series (``--series memory``; only when asked: about 4 minutes on 2 cores): each rank's measured
  training state and peak memory under MLM_SHARDING=ddp and fsdp against model size; bench/memory.py.

What the series share (the environment of a run, one measured torchrun process, the result files) is bench/runner.py.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from bench import heads, memory, packing, quality, real
from bench.demo import DemoSettings, default_settings
from bench.demo_series import run_demo_series
from bench.heads_series import run_heads_series
from bench.memory import run_memory_series
from bench.packing_series import run_packing_series
from bench.quality_series import run_quality_series
from bench.real_series import run_real_series
from bench.runner import ROOT, RunFailed

RESULTS = ROOT / "bench" / "results"
SERIES = ("demo", "real", "heads", "packing", "quality", "memory")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--series",
        help="comma-separated: demo (seed vs ours on the demo data), real (ours vs run_mlm.py on real text, "
        "bench/real.py), heads (masked-only vs dense head per architecture, bench/heads.py; only when asked), "
        "packing (the padding modes: efficiency, speed, held-out loss apart vs across, bench/packing.py; only "
        "when asked), quality (time to run_mlm.py's final held-out loss, bench/quality.py; about 15 min on 2 "
        "cores), memory (each rank's state and peak under ddp and fsdp by model size, bench/memory.py; only when "
        "asked); default demo,real,quality on CPU, demo on GPU (bench/gpu.sh's budget)",
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
    real_options.add_argument(
        "--real-corpus-mb", type=float, help="size of the real-text corpus in MiB, the heads series' too (default 8)"
    )
    heads_options = parser.add_argument_group("heads series (bench/heads.py)")
    heads_options.add_argument(
        "--heads-architectures",
        help=f"comma-separated: {', '.join(heads.ARCHITECTURES)} (default all on CPU; "
        f"{','.join(heads.GPU_ARCHITECTURES)} on GPU)",
    )
    heads_options.add_argument(
        "--heads-size", choices=tuple(heads.SIZES), help="mid: 6 x 384 (default on CPU); base: 12 x 768 (GPU)"
    )
    heads_options.add_argument("--heads-pairs", type=int, help="dense/masked-only pairs (default 3 on CPU, 2 on GPU)")
    heads_options.add_argument("--heads-steps", type=int, help="optimizer steps per run (default 10 on CPU, 60 on GPU)")
    heads_options.add_argument(
        "--heads-batch", type=int, help="128-token blocks per step (default 8 on CPU, 256 on GPU)"
    )
    packing_options = parser.add_argument_group("packing series (bench/packing.py)")
    packing_options.add_argument(
        "--packing-architectures",
        help=f"comma-separated: {', '.join(packing.ARCHITECTURES)} (default bert)",
    )
    packing_options.add_argument(
        "--packing-modes", help=f"comma-separated, alternated in this order (default {','.join(packing.MODES)})"
    )
    packing_options.add_argument(
        "--packing-size", choices=tuple(heads.SIZES), help="mid: 6 x 384 (default on CPU); base: 12 x 768 (GPU)"
    )
    packing_options.add_argument("--packing-repeats", type=int, help="rounds of the modes' speed runs (default 3)")
    packing_options.add_argument("--packing-steps", type=int, help="steps per speed run (default 8 on CPU)")
    packing_options.add_argument(
        "--packing-blocks", type=int, help="128-token blocks per step; the other modes as many tokens (default 8)"
    )
    packing_options.add_argument("--packing-seeds", type=int, help="quality runs' seeds (default 3; 0: none)")
    packing_options.add_argument("--packing-quality-steps", type=int, help="steps per quality run (default 50 on CPU)")
    packing_options.add_argument("--packing-heldout", type=int, help="held-out documents (default 1000)")
    quality_options = parser.add_argument_group("quality series (bench/quality.py)")
    quality_options.add_argument(
        "--quality-systems",
        help=f"comma-separated, run in this order, run_mlm first: {', '.join(quality.SYSTEMS)} "
        f"(default {','.join(quality.DEFAULT_SYSTEMS)})",
    )
    quality_options.add_argument("--quality-model", choices=tuple(real.MODELS), help="default tiny on CPU")
    quality_options.add_argument("--quality-steps", type=int, help="steps of every system (default 240 on CPU)")
    quality_options.add_argument("--quality-batch", type=int, help="samples per step (default 16 on CPU)")
    quality_options.add_argument("--quality-save-steps", type=int, help="a checkpoint every N steps (default 30)")
    quality_options.add_argument("--quality-heldout", type=int, help="held-out lines the judge scores (default 500)")
    quality_options.add_argument(
        "--quality-seed", type=int, help=f"every system's training seed (default {quality.SEED}; the judge keeps it)"
    )
    quality_options.add_argument(
        "--quality-rates",
        help="run_mlm.py's learning-rate sweep, comma-separated; the best is the baseline "
        f"(default {','.join(f'{r:g}' for r in quality.BASELINE_RATES)})",
    )
    parser.add_argument("--workdir", type=Path, help="caches and run outputs (default: a temporary directory)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    memory_options = parser.add_argument_group("memory series (bench/memory.py)")
    memory_options.add_argument(
        "--memory-sizes",
        help=f"comma-separated BERT sizes: {', '.join(memory.SIZES)} (default tiny,small,medium on CPU)",
    )
    memory_options.add_argument("--memory-ranks", type=int, help="ranks of every run (default 2)")
    parser.add_argument("--tag", help="suffix of the result files: <date>-<host>-<tag>.json")
    return parser.parse_args(argv)


def resolve_device(requested: str) -> str:
    """auto: the GPU when torch sees one."""
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def selected_series(args: argparse.Namespace, device: str) -> list[str]:
    """--series, or by default demo, real and quality on a CPU and only the demo series on a GPU (bench/gpu.sh's
    time budget); the heads and packing series only when asked (about 30 and 18 minutes on 2 cores)."""
    default = ["demo"] if device == "cuda" else ["demo", "real", "quality"]
    series = args.series.split(",") if args.series else default
    unknown = [s for s in series if s not in SERIES]
    if unknown:
        raise SystemExit(f"bench: unknown series {', '.join(unknown)}; expected {', '.join(SERIES)}")
    return series


def demo_settings(args: argparse.Namespace, device: str) -> DemoSettings:
    """The demo series' defaults for the device, with what the command line sets."""
    settings = default_settings(device)
    for name in ("repeats", "max_steps", "logging_steps", "extra_steps", "threads"):
        if getattr(args, name) is not None:
            setattr(settings, name, getattr(args, name))
    if args.recipes:
        settings.recipes = args.recipes.split(",")
    if args.extras is not None:  # --extras "" runs none, where the GPU's default runs three
        settings.extras = [e for e in args.extras.split(",") if e]
    return settings


def set_given(settings: object, **options: object) -> None:
    """Set each option the command line gave (not None) on a series' settings."""
    for name, value in options.items():
        if value is not None:
            setattr(settings, name, value)


def real_settings(args: argparse.Namespace, device: str) -> real.RealSettings:
    """The real series' defaults for the device, with what the command line sets (--threads applies to both)."""
    settings = real.default_real_settings(device)
    set_given(settings, pairs=args.real_pairs, max_steps=args.real_steps, batch_size=args.real_batch,
              corpus_mb=args.real_corpus_mb, threads=args.threads, logging_steps=args.logging_steps)  # fmt: skip
    if args.real_models:
        settings.models = args.real_models.split(",")
    if args.real_recipes:
        settings.recipes = args.real_recipes.split(",")
    real.check(settings)
    return settings


def heads_settings(args: argparse.Namespace, device: str) -> heads.HeadsSettings:
    """The heads series' defaults for the device, with what the command line sets (--threads, --logging-steps and
    --real-corpus-mb apply to it too)."""
    settings = heads.default_heads_settings(device)
    set_given(settings, pairs=args.heads_pairs, max_steps=args.heads_steps, batch_size=args.heads_batch,
              size=args.heads_size, corpus_mb=args.real_corpus_mb, threads=args.threads,
              logging_steps=args.logging_steps)  # fmt: skip
    if args.heads_architectures:
        settings.architectures = args.heads_architectures.split(",")
    heads.check(settings)
    return settings


def packing_settings(args: argparse.Namespace, device: str) -> packing.PackingSettings:
    """The packing series' defaults for the device, with what the command line sets (--threads, --logging-steps and
    --real-corpus-mb apply to it too)."""
    settings = packing.default_packing_settings(device)
    set_given(settings, size=args.packing_size, repeats=args.packing_repeats, max_steps=args.packing_steps,
              blocks=args.packing_blocks, seeds=args.packing_seeds, quality_steps=args.packing_quality_steps,
              heldout=args.packing_heldout, corpus_mb=args.real_corpus_mb, threads=args.threads,
              logging_steps=args.logging_steps)  # fmt: skip
    if args.packing_architectures:
        settings.architectures = args.packing_architectures.split(",")
    if args.packing_modes:
        settings.modes = args.packing_modes.split(",")
    packing.check(settings)
    return settings


def quality_settings(args: argparse.Namespace, device: str) -> quality.QualitySettings:
    """The quality series' defaults for the device, with what the command line sets (--threads and
    --real-corpus-mb apply to it too)."""
    settings = quality.default_quality_settings(device)
    set_given(settings, model=args.quality_model, max_steps=args.quality_steps, batch_size=args.quality_batch,
              save_steps=args.quality_save_steps, heldout=args.quality_heldout, corpus_mb=args.real_corpus_mb,
              threads=args.threads, seed=args.quality_seed)  # fmt: skip
    if args.quality_systems:
        settings.systems = args.quality_systems.split(",")
    if args.quality_rates:
        try:
            settings.baseline_rates = [float(rate) for rate in args.quality_rates.split(",")]
        except ValueError:
            raise ValueError(f"--quality-rates {args.quality_rates!r}: expected numbers separated by commas") from None
    quality.check(settings)
    return settings


def memory_settings(args: argparse.Namespace, device: str) -> memory.MemorySettings:
    """The memory series' defaults for the device, with what the command line sets (--threads applies to it too)."""
    settings = memory.default_memory_settings(device)
    set_given(settings, ranks=args.memory_ranks, threads=args.threads)
    if args.memory_sizes:
        settings.sizes = args.memory_sizes.split(",")
    memory.check(settings)
    return settings


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = resolve_device(args.device)
    series = selected_series(args, device)
    settings = demo_settings(args, device)
    try:  # checked before any run, so a misspelt name costs no demo series
        real_config = real_settings(args, device) if "real" in series else None
        heads_config = heads_settings(args, device) if "heads" in series else None
        packing_config = packing_settings(args, device) if "packing" in series else None
        quality_config = quality_settings(args, device) if "quality" in series else None
        memory_config = memory_settings(args, device) if "memory" in series else None
    except ValueError as exc:
        raise SystemExit(f"bench: {exc}") from None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mlm-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stem = f"{datetime.now(UTC):%Y-%m-%d}-{socket.gethostname()}" + (f"-{args.tag}" if args.tag else "")

    if "demo" in series:
        run_demo_series(
            settings, workdir, args.results_dir, stem, tagged=bool(args.tag), entrypoint=not args.no_entrypoint
        )
    if real_config is not None:
        run_real_series(real_config, workdir, args.results_dir, stem, bool(args.tag))
    if heads_config is not None:
        run_heads_series(heads_config, workdir, args.results_dir, stem, bool(args.tag))
    if packing_config is not None:
        run_packing_series(packing_config, workdir, args.results_dir, stem, bool(args.tag))
    if quality_config is not None:
        run_quality_series(quality_config, workdir, args.results_dir, stem, bool(args.tag))
    if memory_config is not None:
        run_memory_series(memory_config, workdir, args.results_dir, stem, bool(args.tag))
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RunFailed as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        sys.exit(1)
