"""Reading every data source into a ``datasets.Dataset``, tokenization (cached) and the padding/packing modes.

Sources: ``demo`` (the seed's sentence repeated), a local file (.txt one example per line, .jsonl/.json, .csv,
.parquet), a directory of such files or one written by ``save_to_disk``, or a hub dataset id.
Rows whose text is null or not a string are dropped (one warning with their count); a source left with none is
an error. Tokenized datasets are cached as Arrow files under the HF cache, keyed by the raw data's fingerprint, the
tokenizer and the settings, so a second run and the other ranks reuse them.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
from datasets import Dataset, DatasetDict

from train.config import Config
from train.console import warn
from train.errors import ConfigError
from train.hf import cache_root, looks_local, offline_hint

DEMO_SENTENCE = "This is a training sample for multi-GPU demonstration."
BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
SAMPLE_INDEX = "sample_index"
CUT_TOKENS = "cut_tokens"  # per example: the text tokens truncation to max_seq_length dropped
CACHE_VERSION = "3"  # bump when tokenization changes shape, to invalidate older caches


@dataclass
class RawData:
    """Train and evaluation text, and a fingerprint naming their content for the caches."""

    splits: DatasetDict
    fingerprint: str


def _read_error(label: str, path: str, exc: BaseException) -> ConfigError:
    cause: BaseException = exc
    while cause.__cause__ is not None:  # datasets wraps the parser's error; its message is the useful one
        cause = cause.__cause__
    first = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:200]
    if isinstance(cause, UnicodeDecodeError) or "codec can't decode" in first:
        where = _first_undecodable_line(Path(path).expanduser())
        first = f"not UTF-8{where}; expected UTF-8 text (convert it, e.g. iconv -f latin1 -t utf-8)"
    return ConfigError(f"{label}={path!r}: cannot be read ({first})")


def _first_undecodable_line(target: Path, limit: int = 10_000_000) -> str:
    """' (file F, line N)' for the first line that is not UTF-8, read as bytes; '' when none is found quickly."""
    files = sorted(p for p in target.iterdir() if p.is_file()) if target.is_dir() else [target]
    for file in files:
        try:
            with file.open("rb") as handle:
                for number, raw in enumerate(handle, start=1):
                    if number > limit:
                        break
                    try:
                        raw.decode("utf-8")
                    except UnicodeDecodeError:
                        return f" (line {number})" if file == target else f" ({file.name}, line {number})"
        except OSError:
            continue
    return ""


def _files_in(directory: Path, label: str) -> list[Path]:
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix.lower() in BUILDERS)
    if not files:
        raise ConfigError(f"{label}={str(directory)!r}: no .txt/.jsonl/.json/.csv/.parquet files in the directory")
    if len({BUILDERS[p.suffix.lower()] for p in files}) > 1:
        raise ConfigError(f"{label}={str(directory)!r}: files of several formats; expected one format per directory")
    return files


def load_local(path: str, label: str, text_column: str) -> Dataset:
    """One local file, a directory of files, or a save_to_disk directory, as a single Dataset."""
    target = Path(path).expanduser()
    if not target.exists():
        raise ConfigError(f"{label}={path!r}: no such file or directory")
    if not os.access(target, os.R_OK):
        raise ConfigError(f"{label}={path!r}: not readable (permission denied)")
    if target.is_dir() and ((target / "dataset_info.json").exists() or (target / "dataset_dict.json").exists()):
        try:
            loaded = datasets.load_from_disk(str(target))
        except Exception as exc:  # noqa: BLE001 - any failure to read is the user's file
            raise _read_error(label, path, exc) from None
        dataset = loaded["train"] if isinstance(loaded, DatasetDict) else loaded
    else:
        files = _files_in(target, label) if target.is_dir() else [target]
        suffix = files[0].suffix.lower()
        if suffix not in BUILDERS:
            raise ConfigError(
                f"{label}={path!r}: unsupported extension {suffix or '(none)'!r}; expected one of "
                + ", ".join(BUILDERS)
            )
        for file in files:
            if not os.access(file, os.R_OK):
                raise ConfigError(f"{label}={str(file)!r}: not readable (permission denied)")
            if file.stat().st_size == 0:
                raise ConfigError(f"{label}={str(file)!r}: the file is empty; expected at least one example")
        # The builders log a parse error before raising it; our one-line error says the same, once.
        verbosity = datasets.logging.get_verbosity()
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)
        try:
            dataset = datasets.load_dataset(
                BUILDERS[suffix], data_files=[str(f) for f in files], split="train", cache_dir=str(cache_root() / "raw")
            )
        except Exception as exc:  # noqa: BLE001 - parser errors vary by format (Arrow, JSON, CSV)
            raise _read_error(label, path, exc) from None
        finally:
            datasets.logging.set_verbosity(verbosity)
    return _text_rows(_checked(dataset, label, path, text_column), f"{label}={path!r}", text_column)


def _checked(dataset: Dataset, label: str, path: str, text_column: str) -> Dataset:
    if text_column not in dataset.column_names:
        raise ConfigError(
            f"{label}={path!r}: no column {text_column!r} (columns: {', '.join(dataset.column_names)}); "
            "set MLM_TEXT_COLUMN"
        )
    if len(dataset) == 0:
        raise ConfigError(f"{label}={path!r}: no examples")
    return dataset.select_columns([text_column])


def _text_rows(dataset: Dataset, source: str, column: str) -> Dataset:
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
    fingerprint = hashlib.sha256(json.dumps([CACHE_VERSION, dataset._fingerprint, column]).encode()).hexdigest()[:20]
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
    if dropped and os.environ.get("RANK", "0") == "0":  # every rank reads the data; one says so
        warn(f"{source}: skipped {dropped} of {len(dataset)} rows whose {column!r} is null or not a string")
    return kept


def load_hub(name: str, config_name: str | None, label: str, text_column: str) -> DatasetDict:
    try:
        loaded = datasets.load_dataset(name, config_name, cache_dir=str(cache_root() / "raw"))
    except Exception as exc:  # noqa: BLE001 - network, offline mode, unknown id
        hint = offline_hint("dataset", "MLM_DATASET")
        raise ConfigError(f"{label}={name!r}: cannot load the hub dataset ({hint})") from exc
    if not isinstance(loaded, DatasetDict):
        loaded = DatasetDict({"train": loaded})
    if "train" not in loaded:
        raise ConfigError(f"{label}={name!r}: the dataset has no train split (splits: {', '.join(loaded)})")
    checked = {k: _checked(v, label, name, text_column) for k, v in loaded.items()}
    for split in {"train", "validation"} & set(checked):  # the splits the job uses
        checked[split] = _text_rows(checked[split], f"{label}={name!r} ({split} split)", text_column)
    return DatasetDict(checked)


def _split(train: Dataset, percentage: int) -> DatasetDict:
    """Hold out the last ``percentage`` percent for evaluation, as the seed does (contiguous, no shuffle)."""
    n_eval = len(train) * percentage // 100
    n_train = len(train) - n_eval
    if n_train < 1:
        raise ConfigError("validation_split_percentage leaves no training data")
    splits = {"train": train.select(range(n_train))}
    if n_eval:
        splits["validation"] = train.select(range(n_train, len(train)))
    return DatasetDict(splits)


def load_raw(config: Config) -> RawData:
    """The configured data as train (+ validation) splits of one ``text``-like column."""
    job = config.job
    if job.dataset == "demo":
        train = Dataset.from_dict({job.text_column: [DEMO_SENTENCE] * job.demo_samples})
        fingerprint = f"demo-{job.demo_samples}"
        splits = _split(train, job.validation_split_percentage)
    elif looks_local(job.dataset):
        train = load_local(job.dataset, config.source_of("dataset"), job.text_column)
        fingerprint = train._fingerprint
        splits = (
            DatasetDict({"train": train}) if job.validation_file else _split(train, job.validation_split_percentage)
        )
    else:
        hub = load_hub(job.dataset, job.dataset_config_name, config.source_of("dataset"), job.text_column)
        fingerprint = hashlib.sha256(
            json.dumps([job.dataset, job.dataset_config_name, {k: v._fingerprint for k, v in hub.items()}]).encode()
        ).hexdigest()[:16]
        splits = (
            DatasetDict({"train": hub["train"], "validation": hub["validation"]})
            if "validation" in hub and not job.validation_file
            else _split(hub["train"], 0 if job.validation_file else job.validation_split_percentage)
        )
    if job.validation_file:
        splits["validation"] = load_local(job.validation_file, config.source_of("validation_file"), job.text_column)
        fingerprint += "-" + splits["validation"]._fingerprint
    if job.max_train_samples:
        splits["train"] = splits["train"].select(range(min(job.max_train_samples, len(splits["train"]))))
    if job.max_eval_samples and "validation" in splits:
        splits["validation"] = splits["validation"].select(range(min(job.max_eval_samples, len(splits["validation"]))))
    fingerprint += f"-{job.max_train_samples}-{job.max_eval_samples}-{job.validation_split_percentage}"
    if "validation" not in splits and config.training.eval_strategy != "no":
        # The Trainer would fail later with a traceback: say which option leaves nothing to evaluate.
        raise ConfigError(
            f"{config.source_of('validation_split_percentage')}={job.validation_split_percentage}: holds out no "
            f"example of the {len(splits['train'])} training example(s); set validation_file, a larger "
            "validation_split_percentage, or eval_strategy no"
        )
    return RawData(splits=splits, fingerprint=fingerprint)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # Calling a fast tokenizer with truncation/padding stores them in its state; they must not change the key.
        saved = json.loads(backend.to_str())
        state = json.dumps({k: v for k, v in saved.items() if k not in ("truncation", "padding")}, sort_keys=True)
    else:
        state = json.dumps(tokenizer.get_vocab(), sort_keys=True)
    return hashlib.sha256(state.encode()).hexdigest()[:16]


def _group_texts(examples: dict[str, list[list[int]]], block: int) -> dict[str, list[list[int]]]:
    """Concatenate and cut into full ``block``-token chunks (run_mlm.py's group_texts); the tail is dropped."""
    concatenated = {k: sum(examples[k], []) for k in examples}
    total = (len(concatenated["input_ids"]) // block) * block
    return {k: [t[i : i + block] for i in range(0, total, block)] for k, t in concatenated.items()}


def _count_cut_tokens(encoded: dict[str, list], count: int) -> dict[str, list]:
    """Keep each example's first (truncated) row of a fast tokenizer's overflowing output, and count the text
    tokens in its overflow rows as the example's ``cut_tokens``."""
    mapping = encoded.pop("overflow_to_sample_mapping", None)
    encoded.pop("overflowing_tokens", None)  # what a slow tokenizer returns instead: not counted
    if mapping is None:
        return {**encoded, CUT_TOKENS: [0] * count}
    first = [i for i, example in enumerate(mapping) if i == 0 or mapping[i - 1] != example]
    cut = [0] * count
    for i, example in enumerate(mapping):
        if i not in first:
            cut[example] += sum(1 for special in encoded["special_tokens_mask"][i] if not special)
    return {**{key: [values[i] for i in first] for key, values in encoded.items()}, CUT_TOKENS: cut}


def truncation(dataset: Dataset) -> dict[str, int]:
    """How many examples of a tokenized split truncation cut, and how many text tokens it dropped."""
    if CUT_TOKENS not in dataset.column_names:
        return {"examples_cut": 0, "tokens_cut": 0}
    cut = 0
    dropped = 0
    for batch in dataset.select_columns([CUT_TOKENS]).iter(batch_size=65536):
        dropped += sum(batch[CUT_TOKENS])
        cut += sum(1 for n in batch[CUT_TOKENS] if n)
    return {"examples_cut": cut, "tokens_cut": dropped}


def tokenize(config: Config, raw: RawData, tokenizer: Any) -> DatasetDict:
    """Tokenize every split the configured way, with a ``sample_index`` column for the collator.

    ``max_length`` pads every example to max_seq_length now (the seed's way); ``dynamic`` leaves examples
    unpadded for the collator to pad per batch; ``packed`` concatenates and cuts into full blocks.
    """
    job = config.job
    column = job.text_column
    key = hashlib.sha256(
        json.dumps(
            [CACHE_VERSION, raw.fingerprint, tokenizer_fingerprint(tokenizer), job.padding, job.max_seq_length, column]
        ).encode()
    ).hexdigest()[:20]
    cache_dir = cache_root() / "tokenized"
    cache_dir.mkdir(parents=True, exist_ok=True)

    def encode(batch: dict[str, list[str]]) -> dict[str, Any]:
        texts = batch[column]  # strings only: load_raw dropped the rest
        if job.padding == "packed":
            # verbose=False: the "longer than the specified maximum" warning means nothing before packing cuts.
            return tokenizer(texts, return_special_tokens_mask=True, return_attention_mask=False, verbose=False)
        encoded = tokenizer(
            texts,
            padding="max_length" if job.padding == "max_length" else False,
            truncation=True,
            max_length=job.max_seq_length,
            return_special_tokens_mask=True,
            return_attention_mask=job.padding == "max_length",
            # The overflow says what truncation dropped: counted per example, then left out.
            return_overflowing_tokens=True,
        )
        return _count_cut_tokens(dict(encoded), len(texts))

    result = {}
    for split, dataset in raw.splits.items():
        tokenized = dataset.map(
            encode,
            batched=True,
            remove_columns=dataset.column_names,
            num_proc=job.preprocessing_num_workers,
            cache_file_name=str(cache_dir / f"{key}-{split}-tok.arrow"),
            desc=f"Tokenizing {split}",
        )
        if job.padding == "packed":
            tokenized = tokenized.map(
                _group_texts,
                batched=True,
                fn_kwargs={"block": job.max_seq_length},
                num_proc=job.preprocessing_num_workers,
                cache_file_name=str(cache_dir / f"{key}-{split}-packed.arrow"),
                desc=f"Packing {split} into {job.max_seq_length}-token blocks",
            )
        if len(tokenized) == 0:
            raise ConfigError(
                f"{config.source_of('dataset')}: the {split} split has no complete {job.max_seq_length}-token "
                "block to pack; use padding dynamic or a smaller max_seq_length"
            )
        result[split] = tokenized.add_column(SAMPLE_INDEX, list(range(len(tokenized))))
    return DatasetDict(result)


def real_token_count(dataset: Dataset, pad_token_id: int) -> int:
    """Non-padding tokens in a tokenized split (what tokens/s figures count)."""
    total = 0
    for batch in dataset.select_columns(["input_ids"]).iter(batch_size=4096):
        total += sum(sum(1 for t in ids if t != pad_token_id) for ids in batch["input_ids"])
    return total
