"""The time-to-quality series of ``make bench``: how long, from launch, each system takes to reach the held-out loss
that transformers' run_mlm.py recipe reaches at its end.

Both systems train the same model from scratch on the same real text (the real series' corpus and WordPiece
tokenizer, bench/real_series.py, less a held-out file) for the same steps and batch, each saving a checkpoint every
``save_steps``. run_mlm.py's recipe (bench/run_mlm.py, ``--line_by_line``) starts under torchrun; ours starts as a
user starts it, through ``./entrypoint.sh`` with its defaults. A checkpoint's wall time is when it was complete
(ours: its ``.complete`` marker; run_mlm.py's stock Trainer: its trainer_state.json, written last) less its
system's launch. One judge scores every checkpoint: ``./entrypoint.sh evaluate`` on the same held-out file, with the
same tokenizer, seed and eval_mlm_probability, so the same masks, whoever trained the model. The target is the
judged loss of run_mlm.py's final checkpoint; a system's time to target is the wall time of its first checkpoint
judged at or below it.

run_mlm.py is given the learning rate its users would pick: its recipe trains once at each rate of
``baseline_rates`` (run_mlm.py's own default, 5e-5, barely moves a model from scratch), each final checkpoint is
judged, and the rate with the lowest judged loss is the baseline: its checkpoints make the curve and its final loss
the target. Our classic recipe (run_mlm.py's optimizer, schedule and masking) takes that rate too; our default
keeps its recipe's own.

This module is the pure part (tested in tests/bench/test_quality.py): settings, each system's flags or options,
the judge's options, the curve arithmetic, the summary and its report; bench/quality_series.py runs it.
``python -m bench.quality RESULTS.json`` renders a results file again by today's rules (its summary and report).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.real import MODELS
from bench.runner import write_results

BLOCK = 128  # max_seq_length of every system and of the judge, as in the real series
SEED = 42  # the judge's (its masks), and the training runs' unless --quality-seed says otherwise
EVAL_MLM_PROBABILITY = 0.15  # the judge's masking rate: run_mlm.py's training rate, our default's too

SYSTEMS: dict[str, str] = {
    "run_mlm": "transformers' run_mlm.py recipe, --line_by_line (bench/run_mlm.py under torchrun); dense head",
    "ours": "./entrypoint.sh with its defaults: a scratch model's modern recipe (30 % masking, warmup-stable-decay, "
    "learning rate 1e-3, AdamW 0.9/0.98, documents packed apart; masked-only head)",
    "ours-classic": "./entrypoint.sh with MLM_RECIPE=classic (run_mlm.py's optimizer, schedule and 15 % masking; "
    "dynamic padding, masked-only head), at run_mlm.py's best learning rate",
    "ours-mask-schedule": "./entrypoint.sh with its defaults and a mask rate falling linearly from 30 % to 15 % "
    "(MLM_FINAL_MLM_PROBABILITY=0.15; Ankner et al. 2023)",
    "ours-batch-warmup": "./entrypoint.sh with its defaults and a global batch growing linearly from a quarter of "
    "its rows to all of them over the first half of the steps (MLM_BATCH_WARMUP_RATIO=0.5; Cramming, ModernBERT)",
    "ours-packed": "./entrypoint.sh with MLM_RECIPE=classic and padding packed (128-token blocks, documents apart), "
    "at run_mlm.py's best learning rate",
}
BASELINE_RATES = [1e-4, 3e-4, 5e-4, 1e-3, 2e-3, 4e-3]  # run_mlm.py's sweep for a small model from scratch
DEFAULT_SYSTEMS = ["run_mlm", "ours", "ours-classic"]
REFERENCE = "run_mlm"  # whose final judged loss is the target, and whose time to it is the numerator


@dataclass
class QualitySettings:
    device: str
    model: str = "tiny"
    systems: list[str] = field(default_factory=lambda: list(DEFAULT_SYSTEMS))
    max_steps: int = 240
    batch_size: int = 16
    save_steps: int = 30
    heldout: int = 500  # held-out lines (documents), out of the training file, the judge's text
    corpus_mb: float = 8.0  # the real series' corpus (its 30,522-token tokenizer needs about 8 MiB of words)
    threads: int | None = None  # OMP_NUM_THREADS of the training runs; None: every core, as a user's job gets
    baseline_rates: list[float] = field(default_factory=lambda: list(BASELINE_RATES))  # run_mlm.py's sweep
    # Every system's training seed (its initial weights, the order of its examples and its masks): repeats at
    # other seeds show how much of a difference between systems is the seed's. The judge keeps SEED.
    seed: int = SEED


def default_quality_settings(device: str) -> QualitySettings:
    if device == "cuda":
        return QualitySettings("cuda", model="mid", max_steps=600, batch_size=64, save_steps=50)
    # On 2 quiet cores (2026-12-05): each run_mlm.py run of the sweep about 65 s, ours (modern, packed) 60 s, ours
    # classic 25 s, each judged checkpoint about 11 s (a fresh evaluate process): about 15 minutes in all with the
    # six-rate sweep (29 judged checkpoints). --quality-rates or --quality-systems run_mlm,ours shorten it.
    return QualitySettings("cpu")


def check(settings: QualitySettings) -> None:
    """Unknown names and sizes that leave no curve are errors that say what is known."""
    if settings.model not in MODELS:
        raise ValueError(f"unknown model {settings.model!r}; expected one of {', '.join(MODELS)}")
    unknown = [s for s in settings.systems if s not in SYSTEMS]
    if unknown:
        raise ValueError(f"unknown system(s) {', '.join(unknown)}; expected {', '.join(SYSTEMS)}")
    if REFERENCE not in settings.systems:
        raise ValueError(f"{REFERENCE} must run: its final judged loss is the target")
    if settings.batch_size < 1 or settings.heldout < 1:
        raise ValueError("batch_size and heldout must be at least 1")
    if not settings.baseline_rates or any(rate <= 0 for rate in settings.baseline_rates):
        raise ValueError(f"baseline_rates {settings.baseline_rates}: give at least one learning rate above 0")
    if not 1 <= settings.save_steps <= settings.max_steps:
        raise ValueError(f"save_steps={settings.save_steps} must be between 1 and max_steps={settings.max_steps}")


def checkpoint_steps(settings: QualitySettings) -> list[int]:
    """The steps each system saves at: every save_steps, and the last step (the Trainer saves there too)."""
    steps = list(range(settings.save_steps, settings.max_steps + 1, settings.save_steps))
    return steps if steps[-1] == settings.max_steps else [*steps, settings.max_steps]


def run_mlm_flags(
    settings: QualitySettings, train_file: str, tokenizer: str, output_dir: str, learning_rate: float
) -> list[str]:
    """run_mlm.py's command line (bench.run_mlm under torchrun): the real series' run_mlm recipe at
    ``learning_rate``, saving a checkpoint every save_steps and keeping them all (save_total_limit unset: the
    Trainer keeps every one)."""
    return [
        "--learning_rate", f"{learning_rate:g}",
        "--model_type", "distilbert", "--config_overrides", MODELS[settings.model], "--tokenizer_name", tokenizer,
        "--train_file", train_file, "--max_seq_length", str(BLOCK), "--line_by_line", "true",
        "--per_device_train_batch_size", str(settings.batch_size), "--max_steps", str(settings.max_steps),
        "--seed", str(settings.seed), "--report_to", "none", "--eval_strategy", "no",
        "--save_strategy", "steps", "--save_steps", str(settings.save_steps), "--logging_steps", "10",
        "--output_dir", output_dir,
    ]  # fmt: skip


def our_options(
    name: str,
    settings: QualitySettings,
    train_file: str,
    tokenizer: str,
    output_dir: str,
    baseline_rate: float | None = None,
) -> dict[str, str]:
    """Our job's options (MLM_<NAME> for ./entrypoint.sh): its defaults but for the model, the data, the steps and
    batch, and the checkpoints (every save_steps, all kept: save_total_limit 0). The whole file trains, as
    run_mlm.py's train_file does, without evaluating (our job requires eval_strategy no when nothing is held out);
    the held-out text is the judge's alone. The classic recipes take run_mlm.py's best rate (``baseline_rate``)."""
    if not name.startswith("ours"):
        raise ValueError(f"{name!r} is not one of our systems")
    options = {
        "model_name_or_path": "scratch:distilbert", "config_overrides": MODELS[settings.model],
        "tokenizer_name": tokenizer, "dataset": train_file, "validation_split_percentage": "0", "eval_strategy": "no",
        "max_seq_length": str(BLOCK), "max_steps": str(settings.max_steps),
        "per_device_train_batch_size": str(settings.batch_size), "seed": str(settings.seed),
        "save_strategy": "steps", "save_steps": str(settings.save_steps), "save_total_limit": "0",
        "output_dir": output_dir,
    }  # fmt: skip
    if name in ("ours-classic", "ours-packed"):
        options["recipe"] = "classic"
        if baseline_rate is not None:
            options["learning_rate"] = f"{baseline_rate:g}"
    if name == "ours-packed":
        options["padding"] = "packed"
    if name == "ours-mask-schedule":
        options["final_mlm_probability"] = "0.15"
    if name == "ours-batch-warmup":
        options["batch_warmup_ratio"] = "0.5"
    return options


def as_flags(options: dict[str, str]) -> list[str]:
    """Options as the command line says them (``--name value``), for filling the cache as the run will."""
    return [part for name, value in options.items() for part in (f"--{name}", value)]


def judge_options(
    checkpoint: str, train_file: str, heldout_file: str, tokenizer: str, output_dir: str
) -> dict[str, str]:
    """``./entrypoint.sh evaluate``'s options for one checkpoint: the same held-out file, tokenizer, length, seed and
    masking rate for every checkpoint of every system, so every score is on the same masked tokens."""
    return {
        "model_name_or_path": checkpoint, "tokenizer_name": tokenizer, "dataset": train_file,
        "validation_file": heldout_file, "max_seq_length": str(BLOCK), "seed": str(SEED),
        "eval_mlm_probability": str(EVAL_MLM_PROBABILITY), "output_dir": output_dir, "report_to": "none",
    }  # fmt: skip


def best_rate(finals: dict[float, float]) -> float:
    """The sweep's learning rate whose final checkpoint has the lowest judged loss (``finals``: rate -> loss; a
    diverged run's NaN never wins)."""
    finite = {rate: loss for rate, loss in finals.items() if loss == loss}
    if not finite:
        raise ValueError(f"every run_mlm.py rate diverged: {finals}")
    return min(finite, key=lambda rate: finite[rate])


def time_to_target(curve: Sequence[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first checkpoint (by step) judged at or below ``target``; None when none is."""
    return next((point for point in sorted(curve, key=lambda p: p["step"]) if point["loss"] <= target), None)


def crossing_seconds(curve: Sequence[dict[str, Any]], target: float) -> float | None:
    """When the curve crosses ``target`` between checkpoints: where the straight line from the last checkpoint judged
    above it to the first at or below it meets it (the first checkpoint's own time where that one is already at
    it); None when none reaches it. Time to target counts whole checkpoints, and their spacing (30 or 100 steps)
    can hide a third of a system's figure; a loss that falls faster than the line crossed sooner, so this errs late."""
    before: dict[str, Any] | None = None
    for point in sorted(curve, key=lambda p: p["step"]):
        if point["loss"] <= target:
            if before is None:
                return float(point["seconds"])
            share = (before["loss"] - target) / (before["loss"] - point["loss"])
            return float(before["seconds"] + share * (point["seconds"] - before["seconds"]))
        before = point
    return None


def summarise(curves: dict[str, list[dict[str, Any]]], walls: dict[str, float]) -> dict[str, Any]:
    """The target (run_mlm.py's final judged loss), each system's final loss, time to target and the ratio
    run_mlm's time / the system's (above 1: the system got there first), by checkpoints and by crossing.
    ``curves``: per system, points of ``step``, ``seconds`` (since launch) and ``loss``; ``walls``: each process's
    launch-to-exit seconds."""
    reference = sorted(curves.get(REFERENCE, []), key=lambda p: p["step"])
    if not reference:
        return {"target": None, "systems": {}}
    target = reference[-1]["loss"]
    reached_by_reference = time_to_target(reference, target)
    crossed_by_reference = crossing_seconds(reference, target)
    assert reached_by_reference is not None and crossed_by_reference is not None  # its own final point is at it
    systems: dict[str, Any] = {}
    for name, curve in curves.items():
        points = sorted(curve, key=lambda p: p["step"])
        if not points:
            continue
        reached = time_to_target(points, target)
        seconds = reached["seconds"] if reached else None
        crossing = crossing_seconds(points, target)
        systems[name] = {
            "final_step": points[-1]["step"],
            "final_loss": points[-1]["loss"],
            "final_seconds": points[-1]["seconds"],
            "wall_s": walls.get(name),
            "target_step": reached["step"] if reached else None,
            "time_to_target_s": seconds,
            "ratio": reached_by_reference["seconds"] / seconds if seconds else None,
            "crossing_s": crossing,
            "crossing_ratio": crossed_by_reference / crossing if crossing else None,
        }
    return {"target": target, "systems": systems}


def number(value: float | None, digits: int) -> str:
    return "never" if value is None else f"{value:,.{digits}f}"


def quality_markdown(result: dict[str, Any]) -> str:
    """The report: the setting, the target, each system's time to it and the ratio, then every curve."""
    settings, summary, env = result["settings"], result["summary"], result["environment"]
    machine = f"GPU {env['gpu']}" if env.get("gpu") else f"CPU, {env['cpu_count']} cores"
    lines = [
        f"# Benchmark: time to quality against run_mlm.py ({result['date'][:10]}, {env['host']})",
        "",
        f"{machine}; torch {env['torch']}, transformers {env['transformers']}. Model {settings['model']} "
        f"(`{result['model']}`), from scratch; {settings['max_steps']} steps of {settings['batch_size']} samples, "
        f"a checkpoint every {settings['save_steps']} steps. Data: {result['corpus']['train_lines']:,} training "
        f"lines of real English from this machine (bench/corpus.py), {result['corpus']['heldout_lines']:,} "
        f"held-out lines judged by `./entrypoint.sh evaluate` (same tokenizer, seed {SEED}, eval_mlm_probability "
        f"{EVAL_MLM_PROBABILITY}: the same masks for every checkpoint). Training seed "
        f"{settings.get('seed', SEED)}. Seconds are since each system's launch.",  # older files: SEED
        "",
    ]
    target = summary["target"]
    if target is None:
        return "\n".join([*lines, "run_mlm.py left no judged checkpoint: no target.", ""])
    lines += [f"Target: run_mlm.py's final judged held-out loss, **{target:.4f}**.", ""]
    sweep = result.get("sweep")
    if sweep:
        tried = ", ".join(f"{float(rate):g}: {loss:.4f}" for rate, loss in sweep["finals"].items())
        lines += [
            f"run_mlm.py's learning rate, swept (final judged loss at each): {tried}; the best, "
            f"**{float(sweep['best']):g}**, is the baseline (its curve and target below), and our classic recipe's "
            "rate.",
            "",
        ]
    lines += [
        "| system | what | final step | final judged loss | process wall s | time to target s (step) "
        "| run_mlm time / its time | crossing s | run_mlm crossing / its crossing |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    described = result.get("systems") or SYSTEMS  # the run's own words for its systems (older files: today's)
    for name, row in summary["systems"].items():
        step = f" ({row['target_step']})" if row["target_step"] is not None else ""
        ratio = f"**{row['ratio']:.2f}x**" if row["ratio"] is not None else "n/a"
        crossing = row.get("crossing_ratio")
        by_crossing = f"**{crossing:.2f}x**" if crossing is not None else "n/a"
        lines.append(
            f"| {name} | {described.get(name, SYSTEMS.get(name, name))} | {row['final_step']} | "
            f"{row['final_loss']:.4f} | {number(row['wall_s'], 1)} | {number(row['time_to_target_s'], 1)}{step} | "
            f"{ratio} | {number(row.get('crossing_s'), 1)} | {by_crossing} |"
        )
    lines += [
        "",
        "Time to target is the first checkpoint judged at or below the target; the crossing is where the straight "
        "line between the last checkpoint above it and the first at or below meets it (a curve falling faster than "
        "the line crossed sooner: it errs late).",
    ]
    lines += ["", "## Curves: checkpoint step, seconds since launch, judged held-out loss", ""]
    for name, curve in result["curves"].items():
        lines += [f"### {name}", "", "| step | s since launch | judged loss |", "|---|---|---|"]
        lines += [f"| {p['step']} | {p['seconds']:.1f} | {p['loss']:.4f} |" for p in curve]
        lines.append("")
    return "\n".join(lines)


def rerendered(path: Path) -> dict[str, Any]:
    """A results file's summary and report made again from its curves and walls by today's rules (new columns
    reach the figures already measured), written back beside it: ``path`` and its ``.md``."""
    result = json.loads(path.read_text(encoding="utf-8"))
    result["summary"] = summarise(result["curves"], result.get("walls", {}))
    write_results(path.parent, path.stem, result, quality_markdown(result), None)
    return result


if __name__ == "__main__":
    for name in sys.argv[1:]:
        rerendered(Path(name))
