"""What continued pretraining adds downstream (issue 53's measure): a model pretrained on general text, the same
model continued on a domain's text, and a random initialisation of the architecture, each fine-tuned on a task of
that domain with ``finetune``'s one recipe over several seeds; their scores with the seeds' spread.

``python -m bench.downstream [--start-steps 1500] [--continue-steps 600] [--per-class 10] [--task-lr 1e-3]
[--task-epochs 30] [--seeds 5]``, every run whole through ./entrypoint.sh (training, then ``finetune``), offline,
from text on this machine:

- general text: the prose of the man pages (sections 1 and 3): technical English that is not licence text
  (bench/corpus.py's text is not used: its /usr/share/doc holds every package's copyright file, the domain here);
- the domain: the licences in /usr/share/common-licenses, every line of six words or more but the task's test
  lines;
- the task: which licence a line comes from, among Apache-2.0, GPL-3 and MPL-2.0 (chance 1/3): ``--per-class``
  lines of each to fine-tune on, 40 of each to score.

The starting model is the demo's architecture (DistilBERT, 2 layers, width 128; ``--architecture`` another) with
a WordPiece tokenizer of 8,000 pieces trained on the general text; the continued model starts from its final/ (the
same tokenizer); the baseline is ``finetune --task_baselines``'s random initialisation of the continued model's
architecture. Writes bench/results/<date>-<host>-downstream-seed<N>.md and .json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.runner import ROOT, child_env, result_header, write_results

LICENCES = Path("/usr/share/common-licenses")
CLASSES = ("Apache-2.0", "GPL-3", "MPL-2.0")
MAN = [Path("/usr/share/man/man1"), Path("/usr/share/man/man3")]
MAN_PAGES = 6000  # a fixed draw of the pages: about 2.3 M words here
TEST_PER_CLASS = 40
PER_CLASS = 10  # lines of each class to fine-tune on
ESCAPES = re.compile(r"\\f[BIRP]|\\f\(..|\\\*\(..|\\\*.|\\\(..|\\[&|^e-]|\\s[-+]?\d|\\.")
RESULTS = Path(__file__).resolve().parent / "results"
ARCHITECTURE = "n_layers=2,n_heads=2,dim=128,hidden_dim=512"


def words_line(line: str) -> str | None:
    """A line of prose: six words or more, whitespace collapsed, mostly letters."""
    text = " ".join(line.split())
    if len(text.split()) < 6 or sum(c.isalpha() for c in text) < 0.7 * len(text):
        return None
    return text


def man_text(line: str) -> str | None:
    """A man page's source line as prose: troff requests and comments dropped, font and character escapes removed."""
    if line.startswith((".", "'", '\\"')):
        return None
    return words_line(ESCAPES.sub("", line))


def general_lines() -> list[str]:
    pages = sorted(p for root in MAN if root.is_dir() for p in root.glob("*.gz"))
    random.Random(0).shuffle(pages)
    lines = []
    for page in pages[:MAN_PAGES]:
        try:
            text = gzip.open(page, "rt", encoding="utf-8", errors="replace").read()
        except (OSError, EOFError):
            continue
        lines += [kept for line in text.splitlines() if (kept := man_text(line))]
    random.Random(1).shuffle(lines)
    return lines


def licence_lines(name: str) -> list[str]:
    lines = [kept for line in (LICENCES / name).read_text(encoding="utf-8").splitlines() if (kept := words_line(line))]
    random.Random(0).shuffle(lines)
    return lines


def split_task(per_class: int) -> tuple[list[dict[str, str]], list[dict[str, str]], list[str]]:
    """The task's train and test rows, and the domain text: every licence's lines but the test rows'."""
    train, test, domain = [], [], []
    for name in CLASSES:
        lines = licence_lines(name)
        test += [{"text": text, "label": name} for text in lines[:TEST_PER_CLASS]]
        train += [{"text": text, "label": name} for text in lines[TEST_PER_CLASS : TEST_PER_CLASS + per_class]]
        domain += lines[TEST_PER_CLASS:]
    for other in sorted(LICENCES.iterdir()):
        if other.is_file() and not other.is_symlink() and other.name not in CLASSES:
            domain += licence_lines(other.name)
    tested = {row["text"] for row in test}  # a licence repeats lines of another (LGPL-3 of GPL-3): not seen twice
    domain = [line for line in domain if line not in tested]
    random.Random(1).shuffle(domain)
    return train, test, domain


def write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def entrypoint(workdir: Path, log: Path, *args: str) -> float:
    """./entrypoint.sh with ``args``, its output in ``log``; its wall seconds (RuntimeError with the log's tail)."""
    env = child_env(workdir, MLM_LOG_FORMAT="text")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    started = time.perf_counter()
    with log.open("w", encoding="utf-8") as out:
        code = subprocess.call([str(ROOT / "entrypoint.sh"), *args], env=env, stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        raise RuntimeError(f"./entrypoint.sh {' '.join(args[:2])}: exit {code}\n{log.read_text()[-2000:]}")
    return time.perf_counter() - started


def scores(block: dict[str, Any]) -> dict[str, Any]:
    """A finetune block's accuracy and macro F1: mean and standard deviation, and each seed's accuracy."""
    return {
        "accuracy": block["mean"]["accuracy"],
        "accuracy_std": block["std"]["accuracy"],
        "macro_f1": block["mean"]["macro_f1"],
        "macro_f1_std": block["std"]["macro_f1"],
        "seeds": [seed["accuracy"] for seed in block["seeds"]],
    }


def report(result: dict[str, Any]) -> str:
    settings, rows = result["settings"], result["models"]
    lines = [
        f"# What continued pretraining adds downstream ({result['date']})",
        "",
        f"`python -m bench.downstream {' '.join(result['argv'])}` on {result['environment']['host']} "
        f"({result['environment']['cpu_count']} CPUs, torch {result['environment']['torch']}). DistilBERT "
        f"({settings.get('architecture', ARCHITECTURE)}), {settings['start_steps']} steps on general text (man "
        "pages), then "
        f"{settings['continue_steps']} steps on the licences of /usr/share/common-licenses but the task's test lines "
        f"(pretraining seed {settings['train_seed']}). "
        f"Task: which of {', '.join(CLASSES)} a line comes from (chance 0.333), {settings['per_class']} lines of "
        f"each to fine-tune on, {TEST_PER_CLASS} of each scored. Fine-tuning: finetune's recipe at learning rate "
        f"{settings['task_lr']}, {settings['task_epochs']} epochs, {settings['seeds']} seeds (mean ± standard "
        "deviation over them).",
        "",
        "| model | accuracy | macro F1 | seeds' accuracy |",
        "|---|---|---|---|",
    ]
    for name, row in rows.items():
        seeds = ", ".join(f"{a:.3f}" for a in row["seeds"])
        lines.append(
            f"| {name} | {row['accuracy']:.3f} ± {row['accuracy_std']:.3f} | {row['macro_f1']:.3f} ± "
            f"{row['macro_f1_std']:.3f} | {seeds} |"
        )
    lines += ["", verdict(rows), ""]
    return "\n".join(lines)


def verdict(rows: dict[str, dict[str, Any]]) -> str:
    """Whether the continued model scored higher than each other model by more than the seeds' spread."""
    continued = rows["continued"]
    parts = []
    for other in ("starting", "random init"):
        gap = continued["accuracy"] - rows[other]["accuracy"]
        spread = max(continued["accuracy_std"] or 0.0, rows[other]["accuracy_std"] or 0.0)
        word = "higher than" if gap > spread else "within the seeds' spread of" if gap > -spread else "lower than"
        parts.append(f"{word} the {other} model ({gap:+.3f} accuracy; the larger spread {spread:.3f})")
    return "The continued model scores " + "; ".join(parts) + "."


def variant(architecture: str, per_class: int) -> str:
    """What a results file's name adds where a run is not the default one (``-4x256``, ``-80-per-class``), so that
    it does not overwrite the default run's results of the same day and seed."""
    size = [value.split("=")[1] for value in architecture.split(",") if value.startswith(("n_layers", "dim"))]
    name = "" if architecture == ARCHITECTURE else "-" + "x".join(size)
    return name + ("" if per_class == PER_CLASS else f"-{per_class}-per-class")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start-steps", type=int, default=1500)
    parser.add_argument("--continue-steps", type=int, default=600)
    parser.add_argument("--per-class", type=int, default=PER_CLASS)
    parser.add_argument("--task-lr", default="1e-3")
    parser.add_argument("--task-epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--train-seed", type=int, default=42, help="the two pretraining runs' seed (repeats)")
    parser.add_argument("--architecture", default=ARCHITECTURE, help="DistilBERT's config overrides (a larger model)")
    parser.add_argument("--workdir", type=Path, default=ROOT / "build" / "bench-downstream")
    args = parser.parse_args(argv)
    work = args.workdir
    train, test, domain = split_task(args.per_class)
    task = work / "task"
    write_lines(task / "train.jsonl", [json.dumps(row) for row in train])
    write_lines(task / "test.jsonl", [json.dumps(row) for row in test])
    general, domain_file = write_lines(work / "general.txt", general_lines()), write_lines(work / "domain.txt", domain)
    common = ["--max_seq_length", "64", "--save_strategy", "no", "--eval_strategy", "no"]
    common += ["--seed", str(args.train_seed)]
    start, continued = work / "start", work / "continued"
    walls = {
        "start": entrypoint(
            work, work / "start.log", "--model_name_or_path", "scratch:distilbert",
            "--config_overrides", args.architecture, "--dataset", str(general), "--tokenizer_vocab_size", "8000",
            "--per_device_train_batch_size", "64",
            "--max_steps", str(args.start_steps), "--output_dir", str(start), "--overwrite_output_dir", "true", *common,
        ),
        "continued": entrypoint(
            work, work / "continued.log", "--model_name_or_path", str(start / "final"), "--dataset", str(domain_file),
            "--per_device_train_batch_size", "32", "--learning_rate", "5e-4", "--max_steps", str(args.continue_steps),
            "--output_dir", str(continued), "--overwrite_output_dir", "true", *common,
        ),
    }  # fmt: skip
    recipe = ["--task", str(task), "--task_learning_rate", args.task_lr, "--task_epochs", str(args.task_epochs)]
    recipe += ["--task_seeds", str(args.seeds)]
    found = {}
    for name, model, extra in (("starting", start, []), ("continued", continued, ["--task_baselines", "true"])):
        out = work / f"finetune-{name}"
        walls[f"finetune {name}"] = entrypoint(
            work, work / f"finetune-{name}.log", "finetune", "--model_name_or_path", str(model / "final"),
            "--output_dir", str(out), *recipe, *extra,
        )  # fmt: skip
        found[name] = json.loads((out / "finetune_results.json").read_text(encoding="utf-8"))
    models = {
        "starting": scores(found["starting"]["pretrained"]),
        "continued": scores(found["continued"]["pretrained"]),
        "random init": scores(found["continued"]["baseline"]),
    }
    settings = {key: value for key, value in vars(args).items() if key != "workdir"}
    result = {
        **result_header(settings),
        "argv": list(argv if argv is not None else sys.argv[1:]),
        "models": models,
        "walls_s": walls,
        "domain_lines": len(domain),
    }
    stem = f"{result['date'][:10]}-{result['environment']['host']}-downstream"
    stem += variant(args.architecture, args.per_class) + f"-seed{args.train_seed}"
    text = report(result)
    write_results(RESULTS, stem, result, text, None)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
