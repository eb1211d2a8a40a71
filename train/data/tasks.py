"""A labelled sequence-classification task for ``./entrypoint.sh finetune`` (train/commands/finetune/), read and
checked before anything is trained.

A task is a local directory holding ``train.*`` and ``test.*``: csv, jsonl/json or parquet (also compressed, as a
corpus may be: train/data/sources.py's suffixes), read by datasets' own builders. A text column, an optional second
text column (a pair task: entailment, paraphrase), a label column of integers or strings. Labels of either kind
become ids 0..k-1 in sorted order, so ``-1``/``1`` or ``neg``/``pos`` work as they are and a label's id is the same
whatever order the rows come in. Every problem a user can fix is one line naming the file or option (ConfigError),
raised here: a fine-tuning run of several seeds must not find a bad test file after its first hour. A GLUE task by
name (``glue:sst2``) or a GLUE download's task folder is read by train/data/glue.py, then checked here the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
from datasets import ClassLabel, Dataset

from train.common.errors import ConfigError
from train.common.hf import cache_root
from train.config import TaskArguments
from train.data.glue import GLUE_PREFIX, GlueTask, from_hub, glue_folder, glue_name, read_local
from train.data.sources import data_format, read_error

TASK_SPLITS = ("train", "test")
TASK_FORMATS = ("csv", "json", "parquet")  # datasets builders with columns (plain .txt has no label)
TASK_SUFFIXES = ".csv, .jsonl, .json or .parquet"
# The columns of a task's Dataset as read_task returns them, whatever the files call them.
TEXT, PAIR, LABEL = "text", "text_pair", "labels"  # "labels": the name the models' forward takes
COLUMN_OPTIONS = ("task_text_column", "task_text_pair_column", "task_label_column")


@dataclass(frozen=True)
class TaskColumns:
    """Which columns of the files hold what, and the options that named them (for messages)."""

    text: str = "text"
    pair: str = "text_pair"
    label: str = "label"
    pair_required: bool = False  # the pair column named explicitly: its absence is an error, not a single-text task
    text_option: str = "task_text_column"
    pair_option: str = "task_text_pair_column"
    label_option: str = "task_label_column"


@dataclass(frozen=True)
class Task:
    """A task as read: both splits with the columns TEXT (PAIR for a pair task) and LABEL (ids), the label of
    each id, and the file each split came from."""

    path: str
    train: Dataset
    test: Dataset
    labels: tuple[str, ...]
    pair: bool
    files: dict[str, str]
    glue: GlueTask | None = None  # a GLUE task (train/data/glue.py): its metric, the class its F1 is of

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def positive(self) -> int | None:
        """The id of the class GLUE's F1 is of (MRPC, QQP), None for any other task."""
        positive = self.glue.positive if self.glue else None
        return self.labels.index(positive) if positive in self.labels else None


def load_task(task: TaskArguments) -> Task:
    """The task the options name (``task`` and the ``task_*_column`` options)."""
    if not task.task:
        raise ConfigError(
            "finetune needs a task: set --task DIR (MLM_TASK), a directory holding train and test files "
            f"({TASK_SUFFIXES}) with a {task.task_text_column!r} and a {task.task_label_column!r} column"
        )
    columns = TaskColumns(
        text=task.task_text_column,
        pair=task.task_text_pair_column,
        label=task.task_label_column,
        pair_required="task_text_pair_column" in task.sources,
        text_option=task.source_of("task_text_column"),
        pair_option=task.source_of("task_text_pair_column"),
        label_option=task.source_of("task_label_column"),
    )
    option = task.source_of("task")
    glue = glue_name(task.task, option) or glue_folder(Path(task.task).expanduser())
    if glue is None:
        return read_task(task.task, columns, option)
    named = [task.source_of(name) for name in COLUMN_OPTIONS if name in task.sources]
    if named:
        raise ConfigError(f"{named[0]}: GLUE's {glue.folder} names its own columns; remove it")
    if task.task.lower().startswith(GLUE_PREFIX):
        shards = from_hub(glue, option)
        raw = {split: read_split(found, option) for split, found in shards.items()}
        files = {split: ", ".join(found) for split, found in shards.items()}
    else:
        data = read_local(glue, Path(task.task).expanduser())
        files, raw = data.files, {"train": data.train, "test": data.test}
    glue_columns = TaskColumns(text=glue.text, pair=glue.pair or PAIR, label="label", pair_required=bool(glue.pair))
    return checked_task(task.task, raw, files, glue_columns, glue)


def read_task(path: str, columns: TaskColumns, option: str = "task") -> Task:
    """Both splits of the task in ``path`` (set by ``option``), checked (``checked_task``)."""
    files = {split: split_file(path, split, option) for split in TASK_SPLITS}
    return checked_task(path, {split: read_split(file, option) for split, file in files.items()}, files, columns)


def checked_task(
    path: str, raw: dict[str, Dataset], files: dict[str, str], columns: TaskColumns, glue: GlueTask | None = None
) -> Task:
    """The task from its splits as read, checked: their columns, at least two classes in train, no test label
    train lacks."""
    pair = columns.pair in raw["train"].column_names
    if columns.pair_required and not pair:
        missing_column(files["train"], raw["train"], columns.pair, columns.pair_option)
    for split, dataset in raw.items():
        for name, option_name in ((columns.text, columns.text_option), (columns.label, columns.label_option)):
            if name not in dataset.column_names:
                missing_column(files[split], dataset, name, option_name)
        if pair and columns.pair not in dataset.column_names:
            missing_column(files[split], dataset, columns.pair, columns.pair_option)
    values = {split: label_values(raw[split], columns.label, files[split]) for split in TASK_SPLITS}
    classes = sorted(set(values["train"]))
    if len(classes) < 2:
        raise ConfigError(
            f"{files['train']}: column {columns.label!r} holds one class ({classes[0]!r}) in all "
            f"{len(values['train'])} rows; expected at least two classes to tell apart"
        )
    unseen = sorted(set(values["test"]) - set(classes))
    if unseen:
        raise ConfigError(
            f"{files['test']}: label {unseen[0]!r} is not among {Path(files['train']).name}'s labels "
            f"({', '.join(map(repr, classes[:10]))}{', ...' if len(classes) > 10 else ''}); a model cannot be "
            "scored on a class it never saw"
        )
    ids = {label: i for i, label in enumerate(classes)}
    built = {
        split: examples(raw[split], columns, pair, [ids[v] for v in values[split]], files[split])
        for split in TASK_SPLITS
    }
    return Task(path, built["train"], built["test"], tuple(str(c) for c in classes), pair, files, glue)


def split_file(path: str, split: str, option: str) -> str:
    """The one ``split.*`` data file of the task directory."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ConfigError(
            f"{option}={path!r}: {'not a directory' if root.exists() else 'no such directory'}; expected a "
            f"local directory holding train and test files ({TASK_SUFFIXES})"
        )
    found = sorted(
        str(p) for p in root.iterdir() if p.name.split(".")[0] == split and data_format(p.name) in TASK_FORMATS
    )
    if not found:
        raise ConfigError(f"{option}={path!r}: no {split} file there; expected {split}.csv, .jsonl, .json or .parquet")
    if len(found) > 1:
        names = ", ".join(Path(f).name for f in found)
        raise ConfigError(f"{option}={path!r}: several {split} files ({names}); expected exactly one")
    return found[0]


def read_split(file: str | list[str], option: str) -> Dataset:
    """One split's file (or its shards, one format) read by its datasets builder (cached under our cache); a parse
    error in one line."""
    files = [file] if isinstance(file, str) else file
    shown = ", ".join(files)
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # the builders log a parse error before raising it
    try:
        dataset = datasets.load_dataset(
            data_format(files[0]), data_files=files, split="train", cache_dir=str(cache_root() / "raw")
        )
    except Exception as exc:  # noqa: BLE001 - parser errors vary by format (Arrow, JSON, CSV)
        raise read_error(option, shown, exc) from None
    finally:
        datasets.logging.set_verbosity(verbosity)
    if len(dataset) == 0:
        raise ConfigError(f"{shown}: no examples")
    return dataset


def missing_column(file: str, dataset: Dataset, column: str, option: str) -> None:
    raise ConfigError(
        f"{file}: no column {column!r} (columns: {', '.join(dataset.column_names)}); set {option} to the column "
        "that holds it"
    )


def label_values(dataset: Dataset, column: str, file: str) -> list[Any]:
    """A split's labels as integers or strings (a parquet's class names for its ClassLabel ids); a missing label,
    a number that is not whole (a regression target) or a list is the user's to fix."""
    feature = dataset.features[column]
    values = dataset[column]
    if isinstance(feature, ClassLabel):
        values = feature.int2str(values)
    elif not isinstance(feature, datasets.Value) or not (
        feature.dtype.startswith(("int", "uint")) or feature.dtype in ("bool", "string", "large_string", "null")
    ):
        raise ConfigError(
            f"{file}: column {column!r} holds {getattr(feature, 'dtype', type(feature).__name__)}; expected class "
            "labels, integers or strings (a regression target is not a classification task)"
        )
    missing = sum(value is None for value in values)
    if missing:
        raise ConfigError(f"{file}: {missing} of {len(values)} rows have no {column!r}; expected a label in every row")
    return [int(value) if isinstance(value, bool) else value for value in values]


def texts(dataset: Dataset, column: str, file: str) -> Sequence[str]:
    """A text column, every row a string (an empty one is a text; a missing one is not)."""
    values = dataset[column]
    bad = sum(not isinstance(value, str) for value in values)
    if bad:
        raise ConfigError(f"{file}: {bad} of {len(values)} rows have no text in {column!r}; expected a string in each")
    return values


def examples(dataset: Dataset, columns: TaskColumns, pair: bool, ids: list[int], file: str) -> Dataset:
    """The split under our column names: TEXT (PAIR) and LABEL."""
    built: dict[str, Sequence[Any]] = {TEXT: texts(dataset, columns.text, file)}
    if pair:
        built[PAIR] = texts(dataset, columns.pair, file)
    built[LABEL] = ids
    return Dataset.from_dict(built)
