"""What a trusted checkpoint costs: ``python -m bench.checkpoints [--steps 4] [--out bench/results]``.

A base-size BERT (110 M parameters, bert-base's sizes with its 30,522-token vocabulary, trained from scratch on the
demo data so nothing is downloaded) through ``./entrypoint.sh`` to exit, a synchronous checkpoint after every step
(``MLM_ASYNC_SAVE=false``: in the background the loop would not wait for what is measured here): each save's
``checkpoint`` record in train.jsonl gives its size, the Trainer's own save (weights, optimizer, scheduler, RNG
state) and what listing every file with its size and SHA-256 added after it (train/run/callbacks.py). Then the
resume's side on the last checkpoint, in this process, min over repeats: the content checks and the safe load of
every pickled file, and the digests checked against the marker (train/outputs/checkpoints.py: ``problem``).
Writes bench/results/<date>-vm-checkpoints.{json,md} and latest-checkpoints.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

from bench.runner import run_entrypoint, write_results
from train.outputs.checkpoints import problem
from train.outputs.marker import manifest_problem
from train.outputs.runfiles import RunFiles

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
BASE_SIZE = "vocab_size=30522"  # scratch:bert is bert-base's config: 12 layers, hidden 768, 12 heads


def run_job(
    work: Path, steps: int, save_steps: int = 1, async_save: bool = False, label: str = "out"
) -> dict[str, Any]:
    """The whole job into ``work/label``, a save every ``save_steps`` steps (after every step by default), a small batch
    of short samples (the save, not the step, is what is measured); its checkpoint records, logged losses and wall
    time. Saves are synchronous unless ``async_save``: this benchmark's figures are the save and its digests on the
    training loop (bench/saves.py compares the background's)."""
    output = work / label
    _, wall = run_entrypoint(
        work,
        config=str(REPO / "configs" / "demo.yaml"),
        model_name_or_path="scratch:bert",
        config_overrides=BASE_SIZE,
        demo_samples="256",
        max_seq_length="32",
        per_device_train_batch_size="2",
        max_steps=str(steps),
        warmup_steps="0",
        save_strategy="steps",
        save_steps=str(save_steps),
        async_save=str(async_save).lower(),
        eval_strategy="no",
        logging_steps="1",
        log_format="json",
        dataloader_num_workers="0",
        output_dir=str(output),
    )
    files = RunFiles(output)
    records = [json.loads(line) for line in files.train_jsonl.read_text().splitlines()]
    saves = [r for r in records if r["event"] == "checkpoint"]
    if len(saves) != steps // save_steps:
        raise RuntimeError(
            f"expected {steps // save_steps} checkpoint records in {files.train_jsonl}, found {len(saves)}"
        )
    losses = {r["step"]: r["loss"] for r in records if r["event"] == "train" and "loss" in r}
    return {"wall_s": wall, "saves": saves, "losses": losses, "last": str(files.checkpoints()[-1])}


def resume_checks(checkpoint: Path, repeats: int) -> dict[str, list[float]]:
    """What a resume spends judging ``checkpoint`` before loading it: everything, and the digests alone."""
    timings: dict[str, list[float]] = {"problem_s": [], "digests_s": []}
    for _ in range(repeats):
        for key, check in (("problem_s", problem), ("digests_s", manifest_problem)):
            started = time.perf_counter()
            found = check(checkpoint)
            timings[key].append(time.perf_counter() - started)
            if found is not None:
                raise RuntimeError(f"{checkpoint.name} should be intact: {found}")
    return timings


def summary(saves: list[dict[str, Any]]) -> dict[str, float]:
    """The first save pays for the file cache and the optimizer's first state: the rest are the steady state."""
    steady = saves[1:] or saves
    save = statistics.median(s["save_s"] for s in steady)
    digest = statistics.median(s["digest_s"] for s in steady)
    mib = statistics.median(s["mib"] for s in steady)
    share = digest / (save + digest)
    return {"mib": mib, "save_s": save, "digest_s": digest, "share": share, "mib_per_s": mib / digest}


def markdown(document: dict[str, Any]) -> str:
    figures, resume = document["summary"], document["resume"]
    lines = [
        f"# What a trusted checkpoint costs ({document['date']}, {document['machine']})",
        "",
        "A base-size BERT (bert-base's sizes, 30,522-token vocabulary) through `./entrypoint.sh`, a checkpoint",
        "after every step, local disk; each save's `checkpoint` record in train.jsonl.",
        f"Command: `{document['command']}`",
        "",
        "| step | checkpoint | Trainer's save | digests + marker | digests' share of the save |",
        "|---|---|---|---|---|",
    ]
    for save in document["job"]["saves"]:
        share = save["digest_s"] / (save["save_s"] + save["digest_s"])
        lines.append(
            f"| {save['step']} | {save['mib']:,.0f} MiB, {save['files']} files | {save['save_s']:.2f} s | "
            f"{save['digest_s']:.2f} s | {share:.0%} |"
        )
    lines += [
        "",
        f"Steady state (the median of saves 2 on): {figures['mib']:,.0f} MiB saved in {figures['save_s']:.2f} s, "
        f"digested in {figures['digest_s']:.2f} s ({figures['mib_per_s']:,.0f} MiB/s, one core): "
        f"{figures['share']:.0%} of the save's time. A resume's checks of the last checkpoint (min of "
        f"{len(resume['problem_s'])}): {min(resume['problem_s']):.2f} s in all, "
        f"{min(resume['digests_s']):.2f} s of it the digests. The whole run: {document['job']['wall_s']:.1f} s.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="steps, a checkpoint after each (at least 2)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the resume's checks")
    parser.add_argument("--out", default=str(RESULTS), help="where the results go")
    args = parser.parse_args(argv)
    if args.steps < 2 or args.repeats < 1:
        parser.error("--steps must be at least 2 and --repeats at least 1")
    with tempfile.TemporaryDirectory(prefix="bench-checkpoints-") as scratch:
        job = run_job(Path(scratch), args.steps)
        resume = resume_checks(Path(job.pop("last")), args.repeats)
    today = date.today().isoformat()
    document = {
        "date": today,
        "machine": f"{os.cpu_count()} CPUs",
        "command": " ".join(["python -m bench.checkpoints", *(argv if argv is not None else sys.argv[1:])]),
        "job": job,
        "resume": resume,
        "summary": summary(job["saves"]),
    }
    text = markdown(document)
    write_results(Path(args.out), f"{today}-vm-checkpoints", document, text, "latest-checkpoints.md")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
