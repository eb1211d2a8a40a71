"""The configured corpus read and split: :func:`load_raw` answers for both modes, so its callers ask no streaming
question.

In memory, every source becomes train (+ validation) splits of one text column: rows whose text is null or not a
string are dropped (one warning with their count), a source left with none is an error, and the seed's
contiguous hold-out gives the validation split unless a file or the hub gives one. Streamed (``streaming:
true``), the training corpus stays a stream (train/data/stream.py) and only what must exist before training is
read: the evaluation examples and a bounded sample a tokenizer trained from scratch learns from.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import replace

import datasets
from datasets import Dataset, DatasetDict, concatenate_datasets
from transformers import TrainingArguments

from train.borrowed.datasets import fingerprint as fingerprint_of
from train.common.console import warn
from train.common.distributed import is_world_zero
from train.common.errors import ConfigError
from train.common.hf import cache_key, cache_root, offline_hint, stores_other_than_the_hub_online
from train.common.mixture import Part, mixture_parts
from train.config import DataArguments
from train.data.identity import data_identity
from train.data.raw import RawData, TextStream
from train.data.sources import Source, demo_dataset, is_remote, read_error, resolve, resolve_files, shown_url
from train.data.stream import open_stream
from train.data.tokenization import CACHE_VERSION

TOKENIZER_SAMPLE = 100_000  # examples of a stream a tokenizer trained from scratch learns from


def load_raw(data: DataArguments, training: TrainingArguments) -> RawData:
    """The configured data: train (+ validation) splits of one ``text``-like column, or for ``streaming`` the
    training stream with its held-out evaluation examples; for a mixture, each source's read alone. ``training``:
    whether anything is evaluated (eval_strategy), which a corpus with nothing held out must say."""
    parts = mixture_parts(data.dataset, data.source_of("dataset"))
    if parts is not None:
        return _mixed(data, training, parts)
    raw = _streamed(data, training) if data.streaming else _in_memory(data, training)
    return replace(raw, identity=data_identity(data, raw.fingerprint))


def _mixed(data: DataArguments, training: TrainingArguments, parts: tuple[Part, ...]) -> RawData:
    """Each source of a mixture read as if it were the dataset option alone (its own held-out part, its own
    max_train_samples and max_eval_samples), and their concatenation for what reads the corpus whole."""
    read = []
    for part in parts:
        alone = data.but(dataset=part.name)
        raw = _in_memory(alone, training)
        identity = {f"{part.key}:{name}": entry for name, entry in data_identity(alone, raw.fingerprint).items()}
        read.append((part, replace(raw, identity=identity)))
    splits = DatasetDict(
        {
            split: concatenate_datasets([raw.splits[split] for _, raw in read])
            for split in ("train", "validation")
            if all(split in raw.splits for _, raw in read)
        }
    )
    weights = [(part.name, round(part.weight, 6)) for part in parts]
    fingerprint = "mixture-" + cache_key([raw.fingerprint for _, raw in read], weights)
    identity = {name: entry for _, raw in read for name, entry in raw.identity.items()}
    return RawData(splits=splits, fingerprint=fingerprint, identity=identity, parts=tuple(read))


def _in_memory(data: DataArguments, training: TrainingArguments) -> RawData:
    source = resolve(data.dataset, data.source_of("dataset"), data.dataset_config_name)
    holdout = 0 if data.validation_file else data.validation_split_percentage
    if source.kind == "demo":
        splits = split_off(demo_dataset(data.text_column, data.demo_samples), data.validation_split_percentage)
        fingerprint = f"demo-{data.demo_samples}"
    elif source.kind == "hub":
        hub = load_hub(source, data.text_column)
        fingerprint = cache_key(data.dataset, data.dataset_config_name, {k: fingerprint_of(v) for k, v in hub.items()})
        splits = (
            DatasetDict({"train": hub["train"], "validation": hub["validation"]})
            if "validation" in hub and not data.validation_file
            else split_off(hub["train"], holdout)
        )
    else:
        train = load_files(source, data.text_column)
        fingerprint = fingerprint_of(train)
        splits = DatasetDict({"train": train}) if data.validation_file else split_off(train, holdout)
    if data.validation_file:
        splits["validation"] = load_local(data.validation_file, data.source_of("validation_file"), data.text_column)
        fingerprint += "-" + fingerprint_of(splits["validation"])
    if data.max_train_samples:
        splits["train"] = splits["train"].select(range(min(data.max_train_samples, len(splits["train"]))))
    if data.max_eval_samples and "validation" in splits:
        splits["validation"] = splits["validation"].select(range(min(data.max_eval_samples, len(splits["validation"]))))
    fingerprint += f"-{data.max_train_samples}-{data.max_eval_samples}-{data.validation_split_percentage}"
    if "validation" not in splits and training.eval_strategy != "no":
        # The Trainer would fail later with a traceback: say which option leaves nothing to evaluate.
        raise ConfigError(
            f"{data.source_of('validation_split_percentage')}={data.validation_split_percentage}: holds out "
            f"no example of the {len(splits['train'])} training example(s); set validation_file, a larger "
            "validation_split_percentage, or eval_strategy no"
        )
    return RawData(splits=splits, fingerprint=fingerprint)


def _streamed(data: DataArguments, training: TrainingArguments) -> RawData:
    """The training stream, and (in the in-memory shape) the evaluation examples plus, for a tokenizer trained
    from scratch, a bounded sample of the stream."""
    rows, fingerprint = open_stream(resolve(data.dataset, data.source_of("dataset"), data.dataset_config_name), data)
    stream = TextStream(rows, data.text_column)
    splits: dict[str, Dataset] = {}
    if data.validation_file:
        evaluation = load_local(data.validation_file, data.source_of("validation_file"), data.text_column)
        if data.max_eval_samples:
            evaluation = evaluation.select(range(min(data.max_eval_samples, len(evaluation))))
        splits["validation"] = evaluation
        fingerprint += "-" + fingerprint_of(evaluation)
    elif data.max_eval_samples:
        # The first examples of the stream are held out. Training leaves them out by their text: skip(n) would be
        # split among the ranks' shards, skipping other examples on every rank but the first.
        splits["validation"] = materialize(stream, data.max_eval_samples)
        stream = replace(stream, held_out=frozenset(splits["validation"][data.text_column]))
    elif training.eval_strategy != "no":
        raise ConfigError(
            f"{data.source_of('streaming')}=true: a stream has no validation split to hold out; set "
            "max_eval_samples (the first examples of the stream are held out), validation_file, or eval_strategy no"
        )
    fingerprint += f"-{data.max_eval_samples}"
    if data.max_train_samples:
        stream = replace(stream, rows=stream.rows.take(data.max_train_samples))
    splits["train"] = materialize(stream, TOKENIZER_SAMPLE)  # for a tokenizer trained from scratch
    return RawData(splits=DatasetDict(splits), fingerprint=f"stream-{fingerprint}", stream=stream)


def materialize(stream: TextStream, count: int) -> Dataset:
    """The first ``count`` texts of the stream, in memory."""
    return Dataset.from_dict({stream.column: list(itertools.islice(stream.texts(), count))})


def split_off(train: Dataset, percentage: int) -> DatasetDict:
    """Hold out the last ``percentage`` percent for evaluation, as the seed does (contiguous, no shuffle)."""
    n_eval = len(train) * percentage // 100
    n_train = len(train) - n_eval
    if n_train < 1:
        raise ConfigError("validation_split_percentage leaves no training data")
    splits = {"train": train.select(range(n_train))}
    if n_eval:
        splits["validation"] = train.select(range(n_train, len(train)))
    return DatasetDict(splits)


def load_local(path: str, label: str, text_column: str) -> Dataset:
    """One file, a directory or glob of files (local or remote), or a save_to_disk directory, as a Dataset."""
    return load_files(resolve_files(path, label), text_column)


def load_files(source: Source, text_column: str) -> Dataset:
    """A ``files`` or ``saved`` source read into memory (Arrow, cached under our cache), its text rows only."""
    path, label = source.name, source.label
    if source.kind == "saved":
        try:
            loaded = datasets.load_from_disk(path)
        except Exception as exc:  # noqa: BLE001 - any failure to read is the user's file
            raise read_error(label, path, exc) from None
        dataset = loaded["train"] if isinstance(loaded, DatasetDict) else loaded
    else:
        # The builders log a parse error before raising it; our one-line error says the same, once.
        verbosity = datasets.logging.get_verbosity()
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)
        online = stores_other_than_the_hub_online() if is_remote(path) else contextlib.nullcontext()
        try:
            with online:
                dataset = datasets.load_dataset(
                    source.builder, data_files=list(source.files), split="train", cache_dir=str(cache_root() / "raw")
                )
        except Exception as exc:  # noqa: BLE001 - parser errors vary by format (Arrow, JSON, CSV)
            raise read_error(label, path, exc) from None
        finally:
            datasets.logging.set_verbosity(verbosity)
    return text_rows(checked(dataset, label, path, text_column), f"{label}={shown_url(path)!r}", text_column)


def load_hub(source: Source, text_column: str) -> DatasetDict:
    """A hub dataset's splits, the ones the job uses (train, validation) with their text rows only."""
    name, label = source.name, source.label
    try:
        loaded = datasets.load_dataset(name, source.config_name, cache_dir=str(cache_root() / "raw"))
    except Exception as exc:  # noqa: BLE001 - network, offline mode, unknown id
        hint = offline_hint("dataset", "MLM_DATASET")
        raise ConfigError(f"{label}={name!r}: cannot load the hub dataset ({hint})") from exc
    if not isinstance(loaded, DatasetDict):
        loaded = DatasetDict({"train": loaded})
    if "train" not in loaded:
        raise ConfigError(f"{label}={name!r}: the dataset has no train split (splits: {', '.join(loaded)})")
    kept = {k: checked(v, label, name, text_column) for k, v in loaded.items()}
    for split in {"train", "validation"} & set(kept):  # the splits the job uses
        kept[split] = text_rows(kept[split], f"{label}={name!r} ({split} split)", text_column)
    return DatasetDict(kept)


def checked(dataset: Dataset, label: str, path: str, text_column: str) -> Dataset:
    """The text column of a non-empty dataset; a missing column names the ones there are."""
    if text_column not in dataset.column_names:
        raise ConfigError(
            f"{label}={path!r}: no column {text_column!r} (columns: {', '.join(dataset.column_names)}); "
            "set MLM_TEXT_COLUMN"
        )
    if len(dataset) == 0:
        raise ConfigError(f"{label}={path!r}: no examples")
    return dataset.select_columns([text_column])


def text_rows(dataset: Dataset, source: str, column: str) -> Dataset:
    """The rows whose text is a string: null and non-string ones are dropped with one warning naming ``source``;
    none left is an error. A string column without nulls is returned as it is; the filter's result is cached."""
    feature = dataset.features[column]
    if isinstance(feature, datasets.Value):
        if feature.dtype not in ("string", "large_string", "null"):  # null: every row is; the filter says so
            raise ConfigError(f"{source}: column {column!r} holds {feature.dtype}, not text; set MLM_TEXT_COLUMN")
        if dataset.data.column(column).null_count == 0:
            return dataset
    cache_dir = cache_root() / "filtered"
    cache_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = cache_key(CACHE_VERSION, fingerprint_of(dataset), column)
    kept = dataset.filter(
        lambda texts: [isinstance(t, str) for t in texts],
        input_columns=[column],
        batched=True,
        cache_file_name=str(cache_dir / f"{fingerprint}.arrow"),
        new_fingerprint=fingerprint,
        desc="Dropping rows without text",
    )
    dropped = len(dataset) - len(kept)
    if not len(kept):
        raise ConfigError(f"{source}: no text: column {column!r} is null or not a string in all {dropped} rows")
    if dropped and is_world_zero():  # every rank reads the data; one says so
        warn(f"{source}: skipped {dropped} of {len(dataset)} rows whose {column!r} is null or not a string")
    return kept
