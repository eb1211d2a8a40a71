"""The GLUE classification tasks by name, for ``./entrypoint.sh finetune --task glue:NAME`` (or ``--task DIR`` where
DIR is a GLUE download's task folder, e.g. ``glue_data/SST-2``), read into the same checked Task as any local task
(train/data/tasks.py).

Where the data comes from:
- ``glue:NAME``: the hub dataset ``nyu-mll/glue`` (the GLUE benchmark's own copy on the Hugging Face Hub), its
  ``NAME/train-*`` and ``NAME/validation-*`` parquet files (MNLI: ``validation_matched``), fetched once into the hub
  cache by ``huggingface_hub.snapshot_download``; offline (``HF_HUB_OFFLINE``), from that cache.
- a local copy in the GLUE layout (the folders that GLUE's ``download_glue_data.py`` writes): ``train.tsv`` and
  ``dev.tsv`` (MNLI: ``dev_matched.tsv``), read as GLUE's own readers read them (transformers' glue processors: tab
  separated, no quoting; CoLA without a header line).

GLUE's test labels are not public, so the score is on the validation split (dev), as every published GLUE table of
these models (ModernBERT's run_evals.py, Cramming, MosaicBERT) reports it. Labels become GLUE's class names from
either source (a local copy's 0/1 are mapped), so both give the same task and the same scores. Each task's headline
metric is GLUE's: Matthews correlation for CoLA, F1 of the positive class beside accuracy for MRPC and QQP, accuracy
for the rest. STS-B (a regression target) and AX (no training split) are not classification tasks here.

Why not ``datasets.load_dataset("nyu-mll/glue", name)``: it resolves the repository through the hub's file-system
API (tree listings, paths-info) and writes the builder's own cache; two files in the hub cache, then read by the
same parquet reader as a local task, keep one path from the files to the checked Task.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path

from datasets import Dataset
from huggingface_hub import snapshot_download

from train.common.errors import ConfigError, first_line
from train.common.hf import hf_home, offline

GLUE_PREFIX = "glue:"
HUB_DATASET = "nyu-mll/glue"
FIELD_LIMIT = 10 * 1024 * 1024  # QQP and MNLI hold long lines; csv's 128 KiB default field limit is not GLUE's


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task: its columns on the hub and in the GLUE download, its class names, and its metric."""

    name: str  # as the hub names its config: cola, sst2, ...
    folder: str  # as the GLUE download names its folder: CoLA, SST-2, ...
    text: str  # the hub's column for the text (the first text of a pair)
    pair: str | None  # the hub's column for a pair's second text
    classes: tuple[str, ...]  # the hub's class names, by id (a GLUE download's 0/1 labels are these ids)
    validation: str = "validation"  # the hub's scored split (the GLUE download's: dev.tsv)
    metric: str = "accuracy"  # GLUE's headline score for the task
    positive: str | None = None  # the class GLUE's F1 is of (MRPC, QQP)
    local_columns: tuple[str | int, str | int | None, str | int] | None = None  # text, pair, label in the .tsv

    @property
    def local_dev(self) -> str:
        """The GLUE download's file of the scored split."""
        return "dev_matched.tsv" if self.name == "mnli" else "dev.tsv"

    def record(self) -> dict[str, str]:
        """finetune_results.json's ``glue``: the task, GLUE's metric for it, the split scored."""
        return {"task": self.name, "metric": self.metric, "scored_on": self.validation}


TASKS = {
    task.name: task
    for task in (
        GlueTask(
            "cola", "CoLA", "sentence", None, ("unacceptable", "acceptable"), metric="mcc",
            local_columns=(3, None, 1),  # no header: source, label, original label, sentence
        ),
        GlueTask(
            "sst2", "SST-2", "sentence", None, ("negative", "positive"), local_columns=("sentence", None, "label")
        ),
        GlueTask(
            "mrpc", "MRPC", "sentence1", "sentence2", ("not_equivalent", "equivalent"), metric="f1",
            positive="equivalent", local_columns=("#1 String", "#2 String", "Quality"),
        ),
        GlueTask(
            "qqp", "QQP", "question1", "question2", ("not_duplicate", "duplicate"), metric="f1", positive="duplicate",
            local_columns=("question1", "question2", "is_duplicate"),
        ),
        GlueTask(
            "mnli", "MNLI", "premise", "hypothesis", ("entailment", "neutral", "contradiction"),
            validation="validation_matched", local_columns=("sentence1", "sentence2", "gold_label"),
        ),
        GlueTask(
            "qnli", "QNLI", "question", "sentence", ("entailment", "not_entailment"),
            local_columns=("question", "sentence", "label"),
        ),
        GlueTask(
            "rte", "RTE", "sentence1", "sentence2", ("entailment", "not_entailment"),
            local_columns=("sentence1", "sentence2", "label"),
        ),
        GlueTask(
            "wnli", "WNLI", "sentence1", "sentence2", ("not_entailment", "entailment"),
            local_columns=("sentence1", "sentence2", "label"),
        ),
    )
}  # fmt: skip
NOT_CLASSIFICATION = {"stsb": "a regression target (a similarity score)", "ax": "a test set only, without labels"}


@dataclass(frozen=True)
class GlueData:
    """A GLUE task's two splits as read, under the hub's columns and class names, with the file each came from."""

    task: GlueTask
    train: Dataset
    test: Dataset
    files: dict[str, str]


def glue_name(task: str, option: str) -> GlueTask | None:
    """The GLUE task ``task`` names (``glue:NAME``), None for any other task; an unknown name is one line."""
    if not task.lower().startswith(GLUE_PREFIX):
        return None
    name = task[len(GLUE_PREFIX) :].strip().lower().replace("-", "")
    if name in TASKS:
        return TASKS[name]
    why = NOT_CLASSIFICATION.get(name)
    known = ", ".join(f"glue:{n}" for n in TASKS)
    raise ConfigError(
        f"{option}={task!r}: " + (f"GLUE's {name} is {why}, not a classification task" if why else "no such GLUE task")
        + f"; expected one of {known}"
    )  # fmt: skip


def glue_folder(path: Path) -> GlueTask | None:
    """The GLUE task whose download folder ``path`` is (its name, e.g. SST-2, and a train.tsv in it), else None."""
    for task in TASKS.values():
        if path.name.lower() == task.folder.lower() and (path / "train.tsv").is_file():
            return task
    return None


def from_hub(task: GlueTask, option: str) -> dict[str, list[str]]:
    """The parquet files of each split (one, or a large split's shards), fetched from the hub into its cache (or
    found there offline)."""
    patterns = {"train": f"{task.name}/train-*.parquet", "test": f"{task.name}/{task.validation}-*.parquet"}
    try:
        root = Path(snapshot_download(HUB_DATASET, repo_type="dataset", allow_patterns=list(patterns.values())))
    except Exception as exc:  # noqa: BLE001 - offline, unreachable, unknown: each is the user's to fix
        why = (
            f"HF_HUB_OFFLINE is set and its {task.name} files are not in the cache ({hf_home()})"
            if offline()
            else f"the hub did not answer ({first_line(exc)}); with no network fill the cache once (HF_HOME) and set "
            "HF_HUB_OFFLINE=1"
        )
        raise ConfigError(
            f"{option}=glue:{task.name}: {HUB_DATASET} could not be fetched: {why}; or put GLUE's {task.folder} "
            f"folder (train.tsv, {task.local_dev}, as download_glue_data.py writes it) on a volume and set {option} "
            "to it"
        ) from None
    files = {}
    for split, pattern in patterns.items():
        found = [str(path) for path in sorted(root.glob(pattern))]  # one file, or a large split's shards
        if not found:
            raise ConfigError(
                f"{option}=glue:{task.name}: {HUB_DATASET} holds no file for {pattern}; its layout changed: use a "
                "local copy in the GLUE layout"
            )
        files[split] = found
    return files


def read_local(task: GlueTask, folder: Path) -> GlueData:
    """A GLUE download's task folder: its train and dev files as GLUE's readers read them, under the hub's
    columns and class names (rows too short for the task's columns are GLUE's own broken lines, left out as its
    readers leave them out)."""
    files = {"train": str(folder / "train.tsv"), "test": str(folder / task.local_dev)}
    read = {split: tsv_rows(task, Path(file)) for split, file in files.items()}
    return GlueData(task, read["train"], read["test"], files)


def tsv_rows(task: GlueTask, file: Path) -> Dataset:
    """One .tsv file of a GLUE download as a Dataset of the hub's columns; ConfigError naming the file."""
    assert task.local_columns is not None
    text, pair, label = task.local_columns
    csv.field_size_limit(min(sys.maxsize, FIELD_LIMIT))
    try:
        with file.open(encoding="utf-8", newline="") as handle:
            rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot be read as a GLUE {task.folder} file ({first_line(exc)})") from None
    header = [] if isinstance(text, int) else rows.pop(0) if rows else []
    wanted = [column for column in (text, pair, label) if column is not None]
    missing = [c for c in wanted if isinstance(c, str) and c not in header]
    if missing:
        raise ConfigError(
            f"{file}: no column {missing[0]!r} in its header ({', '.join(header[:8])}); expected GLUE's "
            f"{task.folder} layout"
        )
    index = [c if isinstance(c, int) else header.index(c) for c in wanted]
    kept = [row for row in rows if len(row) > max(index)]
    columns = [task.text, *([task.pair] if pair is not None else []), "label"]
    built = {name: [row[i] for row in kept] for name, i in zip(columns, index, strict=True)}
    built["label"] = [class_name(task, value, file) for value in built["label"]]
    if not kept:
        raise ConfigError(f"{file}: no examples in GLUE's {task.folder} layout")
    return Dataset.from_dict(built)


def class_name(task: GlueTask, value: str, file: Path) -> str:
    """A GLUE download's label as the hub's class name (its 0/1 are the hub's ids; NLI labels are names already)."""
    if value in task.classes:
        return value
    if value.isdigit() and int(value) < len(task.classes):
        return task.classes[int(value)]
    raise ConfigError(f"{file}: label {value!r} is not one of GLUE {task.folder}'s ({', '.join(task.classes)})")
