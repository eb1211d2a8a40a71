"""Reading every data source into a ``datasets.Dataset``, tokenization (cached) and the padding/packing modes.

Sources: ``demo`` (the seed's sentence repeated); a file (.txt one example per line, .jsonl/.json, .csv,
.parquet; text formats also compressed: .gz, .bz2, .xz, .zst), a directory or glob of such files, or one written
by ``save_to_disk``, local or remote through fsspec (``s3://``, ``gs://``, ``hf://``, ``https://``, credentials
from the filesystem's usual environment); or a hub dataset id.
Rows whose text is null or not a string are dropped (one warning with their count); a source left with none is
an error. Tokenized datasets are cached as Arrow files under the HF cache, keyed by the raw data's fingerprint, the
tokenizer and the settings, so a second run and the other ranks reuse them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, DatasetDict

from train.config import Config
from train.console import warn
from train.errors import ConfigError
from train.hf import cache_root, looks_local, offline_hint

DEMO_SENTENCE = "This is a training sample for multi-GPU demonstration."
BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")  # what datasets decompresses by extension (zstandard: .zst)
REMOTE = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://", re.I)
GLOB = re.compile(r"[*?\[]")
MIN_ROWS_PER_WORKER = 20_000  # below this a tokenization process costs more to start than it saves
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
    if (isinstance(cause, UnicodeDecodeError) or "codec can't decode" in first) and not is_remote(path):
        where = _first_undecodable_line(path, label)
        first = f"not UTF-8{where}; expected UTF-8 text (convert it, e.g. iconv -f latin1 -t utf-8)"
    return ConfigError(f"{label}={shown_url(path)!r}: cannot be read ({first})")


def _first_undecodable_line(path: str, label: str, limit: int = 10_000_000) -> str:
    """' (file F, line N)' for the first line that is not UTF-8, read as (decompressed) bytes; '' when none is
    found quickly."""
    import fsspec  # decompresses by extension, as the builders do

    files = local_files(path, label)
    for file in files:
        try:
            with fsspec.open(file, "rb", compression="infer") as handle:
                for number, raw in enumerate(handle, start=1):
                    if number > limit:
                        break
                    try:
                        raw.decode("utf-8")
                    except UnicodeDecodeError:
                        return f" (line {number})" if len(files) == 1 else f" ({Path(file).name}, line {number})"
        except OSError:
            continue
    return ""


def is_remote(name: str) -> bool:
    """A URL that fsspec reads (s3://, gs://, hf://, https://, ...): files, not a hub dataset id."""
    match = REMOTE.match(name)
    return bool(match) and match["scheme"].lower() != "file"


def shown_url(name: str) -> str:
    """``name`` without the user:password part a URL may carry, for messages."""
    return re.sub(r"^([a-z][a-z0-9+.-]*://)[^/@]*@", r"\1", name, flags=re.I)


def data_format(name: str) -> str | None:
    """The datasets builder for a file name, through one compression suffix (data.jsonl.zst: json); else None."""
    suffixes = [suffix.lower() for suffix in PurePosixPath(name).suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes.pop()
    return BUILDERS.get(suffixes[-1]) if suffixes else None


def _one_format(files: list[str], label: str, path: str) -> str:
    if not files:
        raise ConfigError(
            f"{label}={shown_url(path)!r}: no .txt/.jsonl/.json/.csv/.parquet files (also .gz/.bz2/.xz/.zst) there"
        )
    formats = {data_format(f) for f in files}
    if None in formats:
        odd = PurePosixPath(next(f for f in files if data_format(f) is None))
        raise ConfigError(
            f"{label}={shown_url(path)!r}: unsupported extension {''.join(odd.suffixes[-2:]) or '(none)'!r}; "
            "expected one of " + ", ".join(BUILDERS) + " (optionally compressed: " + ", ".join(COMPRESSIONS) + ")"
        )
    if len(formats) > 1:
        raise ConfigError(f"{label}={shown_url(path)!r}: files of several formats; expected one format per source")
    return formats.pop()  # type: ignore[return-value]


def local_files(path: str, label: str) -> list[str]:
    """The files a local path names: itself, a directory's data files, or a glob's matches; sorted, checked
    readable and non-empty."""
    target = Path(path).expanduser()
    if GLOB.search(path) and not target.exists():
        files = sorted(str(p) for p in target.parent.glob(target.name) if p.is_file()) if target.parent.is_dir() else []
        if not files:
            raise ConfigError(f"{label}={path!r}: the pattern matches no file")
    elif not target.exists():
        raise ConfigError(f"{label}={path!r}: no such file or directory")
    elif not os.access(target, os.R_OK):
        raise ConfigError(f"{label}={path!r}: not readable (permission denied)")
    elif target.is_dir():
        files = sorted(str(p) for p in target.iterdir() if p.is_file() and data_format(p.name))
    else:
        files = [str(target)]
    _one_format(files, label, path)
    for file in files:
        if not os.access(file, os.R_OK):
            raise ConfigError(f"{label}={file!r}: not readable (permission denied)")
        if os.stat(file).st_size == 0:
            raise ConfigError(f"{label}={file!r}: the file is empty; expected at least one example")
    return files


def remote_files(url: str, label: str) -> list[str]:
    """The files a URL names, listed through fsspec: itself, a "directory"'s data files, or a glob's matches."""
    import fsspec  # only remote sources need it

    shown = shown_url(url)
    try:
        fs, root = fsspec.core.url_to_fs(url)
        if GLOB.search(root):
            found = sorted(fs.glob(root))
        elif fs.isdir(root):
            found = sorted(f for f in fs.ls(root, detail=False) if data_format(f) and fs.isfile(f))
        elif fs.exists(root):
            found = [root]
        else:
            raise ConfigError(f"{label}={shown!r}: no such file or prefix")
    except ConfigError:
        raise
    except (ImportError, ValueError) as exc:  # fsspec: no filesystem for the scheme, or its package is missing
        raise ConfigError(f"{label}={shown!r}: cannot be read ({_first_line(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - credentials, network, permissions: the filesystem says which
        raise ConfigError(f"{label}={shown!r}: cannot be listed ({_first_line(exc)}); check the credentials") from None
    if not found:
        raise ConfigError(f"{label}={shown!r}: the pattern matches no file")
    files = [fs.unstrip_protocol(f) for f in found]
    _one_format(files, label, url)
    return files


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def source_files(path: str, label: str) -> tuple[str, list[str]]:
    """The builder and files of a local or remote path (file, directory, glob)."""
    files = remote_files(path, label) if is_remote(path) else local_files(path, label)
    return _one_format(files, label, path), files


def load_local(path: str, label: str, text_column: str) -> Dataset:
    """One file, a directory or glob of files (local or remote), or a save_to_disk directory, as a Dataset."""
    target = Path(path).expanduser()
    if target.is_dir() and ((target / "dataset_info.json").exists() or (target / "dataset_dict.json").exists()):
        try:
            loaded = datasets.load_from_disk(str(target))
        except Exception as exc:  # noqa: BLE001 - any failure to read is the user's file
            raise _read_error(label, path, exc) from None
        dataset = loaded["train"] if isinstance(loaded, DatasetDict) else loaded
    else:
        builder, files = source_files(path, label)
        # The builders log a parse error before raising it; our one-line error says the same, once.
        verbosity = datasets.logging.get_verbosity()
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)
        try:
            dataset = datasets.load_dataset(
                builder, data_files=files, split="train", cache_dir=str(cache_root() / "raw")
            )
        except Exception as exc:  # noqa: BLE001 - parser errors vary by format (Arrow, JSON, CSV)
            raise _read_error(label, path, exc) from None
        finally:
            datasets.logging.set_verbosity(verbosity)
    return _text_rows(_checked(dataset, label, path, text_column), f"{label}={shown_url(path)!r}", text_column)


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
    elif is_remote(job.dataset) or looks_local(job.dataset):
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


def group_texts(examples: dict[str, list[list[int]]], block: int) -> dict[str, list[list[int]]]:
    """Concatenate and cut into full ``block``-token chunks (run_mlm.py's group_texts); the tail is dropped.
    Linear in the batch's tokens (``sum(lists, [])`` would copy the growing list once per example)."""
    grouped = {}
    for key, rows in examples.items():
        if key == CUT_TOKENS:
            continue
        flat = list(itertools.chain.from_iterable(rows))
        total = (len(flat) // block) * block
        grouped[key] = [flat[i : i + block] for i in range(0, total, block)]
    return grouped


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


def truncation(dataset: Any) -> dict[str, int]:
    """How many examples of a tokenized split truncation cut, and how many text tokens it dropped."""
    table = _table(dataset)
    if table is None or CUT_TOKENS not in table.column_names:
        return {"examples_cut": 0, "tokens_cut": 0}
    cut = table.column(CUT_TOKENS)
    return {
        "examples_cut": int(pc.sum(pc.greater(cut, 0)).as_py() or 0),
        "tokens_cut": int(pc.sum(cut).as_py() or 0),
    }


def _table(dataset: Any) -> pa.Table | None:
    """The Arrow table behind a tokenized split (its rows in order), or None for a stream."""
    base = dataset.examples if isinstance(dataset, IndexedExamples) else dataset
    if not isinstance(base, Dataset):
        return None
    return base.with_format("arrow")[:] if base._indices is not None else base.data.table


def preprocessing_workers(config: Config, rows: int) -> int | None:
    """Tokenization processes, as datasets' ``num_proc``: the configured number, else one per CPU this process may
    use (cgroup-aware, see train.resources.usable_cpus), as long as each gets MIN_ROWS_PER_WORKER rows or more.

    One is None, the calling process, not a pool of one: datasets forks for num_proc=1, and a forked fast tokenizer
    turns its own threads off, which made one process 4-11 % slower than run_mlm.py's."""
    workers = config.job.preprocessing_num_workers
    if workers is None:
        from train.resources import usable_cpus

        workers = max(1, min(usable_cpus(), rows // MIN_ROWS_PER_WORKER))
    return workers if workers > 1 else None


class IndexedExamples:
    """A tokenized split whose examples carry their position as ``sample_index`` (what the collator keys its
    masks on), computed when read: a stored column would cost a full rewrite of the split or 8 bytes per example
    in memory. A map-style dataset for the DataLoader (len, getitem and the batched getitems torch uses)."""

    def __init__(self, examples: Dataset) -> None:
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int | str) -> Any:
        if isinstance(index, str):  # a column, as datasets.Dataset reads one
            return range(len(self.examples)) if index == SAMPLE_INDEX else self.examples[index]
        return {**self.examples[int(index)], SAMPLE_INDEX: int(index)}

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        batch = self.examples[list(map(int, indices))]
        keys = list(batch)
        return [{**{k: batch[k][i] for k in keys}, SAMPLE_INDEX: int(n)} for i, n in enumerate(indices)]

    @property
    def column_names(self) -> list[str]:
        return [*self.examples.column_names, SAMPLE_INDEX]

    def __getattr__(self, name: str) -> Any:  # features, info, select... of the underlying split
        return getattr(self.examples, name)


def encode_texts(tokenizer: Any, texts: list[str], job: Any, count_cut: bool) -> dict[str, Any]:
    """A batch of texts tokenized the way ``job.padding`` needs: whole for packing (which cuts the blocks itself),
    else cut to max_seq_length and, for ``count_cut``, with each example's ``cut_tokens`` counted."""
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
        return_overflowing_tokens=count_cut,
    )
    return _count_cut_tokens(dict(encoded), len(texts)) if count_cut else dict(encoded)


def tokenize(config: Config, raw: RawData, tokenizer: Any) -> dict[str, IndexedExamples]:
    """Tokenize every split the configured way; its examples carry a ``sample_index`` for the collator.

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
        return encode_texts(tokenizer, batch[column], job, count_cut=True)  # strings only: load_raw dropped the rest

    result = {}
    for split, dataset in raw.splits.items():
        workers = preprocessing_workers(config, len(dataset))
        tokenized = dataset.map(
            encode,
            batched=True,
            remove_columns=dataset.column_names,
            num_proc=workers,
            cache_file_name=str(cache_dir / f"{key}-{split}-tok.arrow"),
            desc=f"Tokenizing {split}",
        )
        if job.padding == "packed":
            tokenized = tokenized.map(
                group_texts,
                batched=True,
                fn_kwargs={"block": job.max_seq_length},
                num_proc=workers,
                cache_file_name=str(cache_dir / f"{key}-{split}-packed.arrow"),
                desc=f"Packing {split} into {job.max_seq_length}-token blocks",
            )
        if len(tokenized) == 0:
            raise ConfigError(
                f"{config.source_of('dataset')}: the {split} split has no complete {job.max_seq_length}-token "
                "block to pack; use padding dynamic or a smaller max_seq_length"
            )
        result[split] = IndexedExamples(tokenized)
    return result


def real_token_count(dataset: Any, pad_token_id: int) -> int:
    """Non-padding tokens in a tokenized split (what tokens/s figures count), counted by Arrow, not per token."""
    table = _table(dataset)
    if table is None:
        return 0
    tokens = pc.list_flatten(table.column("input_ids"))
    return int(pc.sum(pc.not_equal(tokens, pad_token_id)).as_py() or 0)
