"""What a checkpoint costs the training loop, synchronous or in the background:
``python -m bench.saves [--steps 30] [--save-steps 10] [--out bench/results]``.

The job of bench/checkpoints.py (a base-size BERT, 110 M parameters, from scratch on the demo data, through
``./entrypoint.sh`` to exit) run four times on one cache, filled by a one-step run first, alternating
``MLM_ASYNC_SAVE=false`` and ``true`` (sync, async, sync, async: a machine that drifts drifts for both), a
checkpoint every ``--save-steps`` steps. Each
save's ``checkpoint`` record gives the time the loop waited for it (``save_blocking_s``) and the time written
behind it (``save_background_s``); each run's wall time is launcher to exit. The runs must agree on every logged
loss and on ``final/model.safetensors`` byte for byte: a background save changes when the files are written, not
what is trained. Writes bench/results/<date>-vm-saves.{json,md} and latest-saves.md.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

from bench.checkpoints import run_job
from bench.runner import write_results
from train.outputs.runfiles import RunFiles

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
MODES = (("sync", False), ("async", True), ("sync", False), ("async", True))


def run_series(work: Path, steps: int, save_steps: int) -> list[dict[str, Any]]:
    """The four runs, in MODES' order, after an untimed one-step run that fills the cache (the tokenizer, the
    tokenized corpus) for them all: each one's mode, wall time, checkpoint records, losses and final weights'
    SHA-256."""
    run_job(work, 1, label="warm-up")
    runs = []
    for i, (mode, async_save) in enumerate(MODES):
        label = f"{i}-{mode}"
        job = run_job(work, steps, save_steps=save_steps, async_save=async_save, label=label)
        weights = RunFiles(work / label).final / "model.safetensors"
        runs.append({"mode": mode, **job, "final_sha256": hashlib.sha256(weights.read_bytes()).hexdigest()})
    return runs


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode, the median over its runs' saves of the loop's wait and of the write behind it, and the mean wall
    time; the background's wait as a share of the synchronous save's, the wall times' ratio, and whether every run
    logged the same losses and ended with the same weights."""
    figures: dict[str, Any] = {}
    for mode in ("sync", "async"):
        saves = [save for run in runs if run["mode"] == mode for save in run["saves"]]
        figures[mode] = {
            "blocking_s": statistics.median(s["save_blocking_s"] for s in saves),
            "background_s": statistics.median(s["save_background_s"] for s in saves),
            "wall_s": statistics.mean(run["wall_s"] for run in runs if run["mode"] == mode),
            "mib": statistics.median(s["mib"] for s in saves),
        }
    sync, background = figures["sync"], figures["async"]
    figures["blocking_share"] = background["blocking_s"] / sync["blocking_s"]
    figures["wall_ratio"] = background["wall_s"] / sync["wall_s"]
    figures["same_losses"] = all(run["losses"] == runs[0]["losses"] for run in runs)
    figures["same_weights"] = len({run["final_sha256"] for run in runs}) == 1
    return figures


def markdown(document: dict[str, Any]) -> str:
    figures = document["summary"]
    sync, background = figures["sync"], figures["async"]
    lines = [
        f"# What a checkpoint costs the training loop ({document['date']}, {document['machine']})",
        "",
        f"A base-size BERT (110 M parameters, {sync['mib']:,.0f} MiB a checkpoint) through `./entrypoint.sh`, a",
        f"checkpoint every {document['save_steps']} steps, local disk; sync and async alternated on one cache, "
        f"filled by an untimed run first. "
        f"{document['note']}",
        f"Command: `{document['command']}`",
        "",
        "| run | mode | wall | per save: the loop's wait | written behind it |",
        "|---|---|---|---|---|",
    ]
    for i, run in enumerate(document["runs"]):
        waits = ", ".join(f"{s['save_blocking_s']:.2f}" for s in run["saves"])
        behind = ", ".join(f"{s['save_background_s']:.2f}" for s in run["saves"])
        lines.append(f"| {i + 1} | {run['mode']} | {run['wall_s']:.1f} s | {waits} s | {behind} s |")
    same = "identical" if figures["same_losses"] and figures["same_weights"] else "NOT identical"
    lines += [
        "",
        f"Median per save: a synchronous save held the loop {sync['blocking_s']:.2f} s; a background one "
        f"{background['blocking_s']:.2f} s ({figures['blocking_share']:.0%} of it), while "
        f"{background['background_s']:.2f} s were written behind it. Wall time (mean of the two runs of each): "
        f"{background['wall_s']:.1f} s in the background against {sync['wall_s']:.1f} s synchronous "
        f"({figures['wall_ratio']:.2f}x). Losses and `final/model.safetensors`: {same} in all "
        f"{len(document['runs'])} runs.",
    ]
    return "\n".join(lines) + "\n"


def without_note(argv: list[str] | None) -> list[str]:
    """The command's arguments as the report shows them: the note is a sentence of its own."""
    shown = list(argv if argv is not None else sys.argv[1:])
    if "--note" in shown:
        at = shown.index("--note")
        del shown[at : at + 2]
    return shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="steps of each run")
    parser.add_argument("--save-steps", type=int, default=10, help="steps between checkpoints")
    parser.add_argument("--note", default="", help="a sentence on the machine's state (shared with other work...)")
    parser.add_argument("--out", default=str(RESULTS), help="where the results go")
    args = parser.parse_args(argv)
    if args.save_steps < 1 or args.steps < args.save_steps:
        parser.error("--save-steps must be at least 1 and at most --steps")
    with tempfile.TemporaryDirectory(prefix="bench-saves-") as scratch:
        runs = run_series(Path(scratch), args.steps, args.save_steps)
    for run in runs:
        run.pop("last")
    today = date.today().isoformat()
    document = {
        "date": today,
        "machine": f"{os.cpu_count()} CPUs",
        "note": args.note,
        "command": shlex.join(["python", "-m", "bench.saves", *without_note(argv)]),
        "save_steps": args.save_steps,
        "runs": runs,
        "summary": summary(runs),
    }
    text = markdown(document)
    write_results(Path(args.out), f"{today}-vm-saves", document, text, "latest-saves.md")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
