"""Tokenization (cached), packing and the counts the logs report: real tokens, truncation.

Tokenized splits are cached as Arrow files under the HF cache, keyed by the raw data's fingerprint, the tokenizer
and the settings, so a second run and the other ranks reuse them. How each padding mode tokenizes (padded now,
left for the collator, or whole and cut into blocks) is the mode's own rule: train/data/padding.py.
"""

from __future__ import annotations

import bisect
import itertools
import json
import operator
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, concatenate_datasets
from transformers.tokenization_utils_base import TruncationStrategy
from transformers.utils import PaddingStrategy

from train.common.errors import ConfigError
from train.common.hf import cache_key, cache_root
from train.config import MIN_ROWS_PER_WORKER, DataArguments
from train.data.padding import Padding
from train.data.raw import RawData
from train.machine.resources import usable_cpus

SAMPLE_INDEX = "sample_index"  # per example: what the collator keys its masks on (train/model/collator.py)
CUT_TOKENS = "cut_tokens"  # per example: the text tokens truncation to max_seq_length dropped
DOCUMENT_LENGTHS = "document_lengths"  # per packed block: the lengths of the documents (or their pieces) in it
CACHE_VERSION = "4"  # bump when a cached step (filter, tokenization) changes shape, to invalidate older caches


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A name for the tokenizer's vocabulary and rules, part of the tokenized cache's key."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # Calling a fast tokenizer with truncation/padding stores them in its state; they must not change the key.
        saved = json.loads(backend.to_str())
        return cache_key({k: v for k, v in saved.items() if k not in ("truncation", "padding")})
    return cache_key(tokenizer.get_vocab())


def group_texts(examples: dict[str, list[list[int]]], block: int) -> dict[str, list[list[int]]]:
    """Concatenate and cut into full ``block``-token chunks (run_mlm.py's group_texts); the tail is dropped.
    Linear in the batch's tokens (``sum(lists, [])`` would copy the growing list once per example). Each chunk
    also gets its documents' lengths (``document_lengths``: a document cut by a block boundary counts as one
    piece in each block), what keeps them apart in attention (train/model/packing.py)."""
    grouped = {}
    for key, rows in examples.items():
        if key == CUT_TOKENS:
            continue
        flat = list(itertools.chain.from_iterable(rows))
        total = (len(flat) // block) * block
        grouped[key] = [flat[i : i + block] for i in range(0, total, block)]
    ends = list(itertools.accumulate(len(row) for row in examples["input_ids"] if row))
    grouped[DOCUMENT_LENGTHS] = [_pieces(ends, start, start + block) for start in range(0, total, block)]
    return grouped


def _pieces(ends: list[int], start: int, stop: int) -> list[int]:
    """The lengths of the documents ending at ``ends`` (cumulative) within the tokens [start, stop)."""
    lengths, at = [], start
    for end in ends[bisect.bisect_right(ends, start) :]:
        lengths.append(min(end, stop) - at)
        at = min(end, stop)
        if at == stop:
            break
    return lengths


# Each column's Arrow type: what datasets inferred from transformers' Python lists (its OptimizedTypedSequence), which
# the tokenized cache has always held and the collator, packing and the stream read; and the ``tokenizers`` Encoding
# attribute it is read from (transformers' BatchEncoding names them so).
COLUMN_TYPES = {
    "input_ids": pa.list_(pa.int32()),
    "token_type_ids": pa.list_(pa.int8()),
    "attention_mask": pa.list_(pa.int8()),
    "special_tokens_mask": pa.list_(pa.int8()),
    CUT_TOKENS: pa.int64(),
}
ENCODING_FIELDS = {
    "input_ids": "ids",
    "token_type_ids": "type_ids",
    "attention_mask": "attention_mask",
    "special_tokens_mask": "special_tokens_mask",
}


def encode_columns(tokenizer: Any, texts: list[str], data: DataArguments, count_cut: bool) -> pa.Table:
    """A batch of texts tokenized the way ``data.padding`` needs, as Arrow columns: whole for packing (which cuts
    the blocks itself), else cut to max_seq_length (and padded to it for ``max_length``) and, for ``count_cut``,
    with each example's ``cut_tokens``: the text tokens truncation dropped.

    A fast tokenizer's batch goes from the ``tokenizers`` library straight to Arrow: its encodings are configured
    and made as transformers' ``tokenizer(texts, ...)`` makes them (the same ids, masks and truncation), without
    transformers' per-encoding dicts, overflow rows and datasets' type inference on the way, which took 40 % of
    tokenizing (issue 70). The special-tokens mask is the library's, not recomputed from the ids: to it a literal
    "[SEP]" in the text is text. A slow (Python) tokenizer is called as before; its cuts are not counted."""
    padding = Padding(data.padding)
    columns = ["input_ids", "special_tokens_mask"]
    if "token_type_ids" in tokenizer.model_input_names:  # what transformers returns unless told
        columns.insert(1, "token_type_ids")
    if padding.pads_when_tokenized:
        columns.insert(-1, "attention_mask")
    pad = PaddingStrategy.MAX_LENGTH if padding.pads_when_tokenized else PaddingStrategy.DO_NOT_PAD
    truncate = TruncationStrategy.DO_NOT_TRUNCATE if padding.packs else TruncationStrategy.LONGEST_FIRST
    max_length = None if padding.packs else data.max_seq_length
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        encoded = tokenizer(
            texts,
            padding=pad,
            truncation=truncate,
            max_length=max_length,
            return_special_tokens_mask=True,
            return_attention_mask=padding.pads_when_tokenized,
            verbose=False,  # "longer than the specified maximum" means nothing before packing cuts
        )
        table = {name: pa.array(encoded[name], COLUMN_TYPES[name]) for name in columns}
        cut = np.zeros(len(texts), np.int64)
    else:
        # transformers' own rule for the library's truncation and padding settings (its side, pad id, ...)
        tokenizer.set_truncation_and_padding(
            padding_strategy=pad,
            truncation_strategy=truncate,
            max_length=max_length,
            stride=0,
            pad_to_multiple_of=None,
            padding_side=None,
        )
        if backend.encode_special_tokens != tokenizer.split_special_tokens:
            backend.encode_special_tokens = tokenizer.split_special_tokens
        # encode_batch's encodings without their character offsets (all zero), which nothing here reads: 20-25 % less
        # CPU than the encode_batch transformers calls, the same ids, masks and overflow rows
        encodings = backend.encode_batch_fast(texts, add_special_tokens=True)
        table = {
            name: pa.array(list(map(operator.attrgetter(ENCODING_FIELDS[name]), encodings)), COLUMN_TYPES[name])
            for name in columns
        }
        cut = cut_tokens(encodings, table, max_length)
    if count_cut and not padding.packs:
        table[CUT_TOKENS] = pa.array(cut, COLUMN_TYPES[CUT_TOKENS])
    return pa.table(table)


def cut_tokens(encodings: list[Any], table: dict[str, pa.Array], max_length: int | None) -> np.ndarray:
    """Per example, the text tokens truncation to ``max_length`` dropped: those of its overflow rows (each row
    carries the sequence's special tokens again, and its padding, which the special-tokens mask marks too). Only
    an example whose row is full of real tokens can have been cut: only those, found on the arrays, are asked."""
    cut = np.zeros(len(encodings), np.int64)
    if max_length is None:
        return cut
    ids = table["input_ids"]
    if "attention_mask" in table:  # padded to max_length: the real tokens are where the mask is 1
        mask = table["attention_mask"]
        real = np.bincount(
            pc.list_parent_indices(mask).to_numpy(), weights=pc.list_flatten(mask).to_numpy(), minlength=len(mask)
        )
    else:
        real = pc.list_value_length(ids).to_numpy()
    for i in np.flatnonzero(real == max_length):
        cut[i] = sum(len(row) - sum(row.special_tokens_mask) for row in encodings[i].overflowing)
    return cut


def encode_texts(tokenizer: Any, texts: list[str], data: DataArguments, count_cut: bool) -> dict[str, list]:
    """:func:`encode_columns` as Python lists, for a stream's batch (train/data/stream.py packs and hashes lists)."""
    return encode_columns(tokenizer, texts, data, count_cut).to_pydict()


def preprocessing_workers(configured: int | None, rows: int) -> int | None:
    """Tokenization processes, as datasets' ``num_proc``: the ``configured`` number (preprocessing_num_workers),
    else one per CPU this process may use (cgroup-aware, see train.machine.resources.usable_cpus), as long as each
    gets MIN_ROWS_PER_WORKER rows or more.

    One is None, the calling process, not a pool of one: datasets forks for num_proc=1, and a forked fast tokenizer
    turns its own threads off, which made one process 4-11 % slower than run_mlm.py's."""
    workers = configured if configured is not None else max(1, min(usable_cpus(), rows // MIN_ROWS_PER_WORKER))
    return workers if workers > 1 else None


def in_cache(cache_dir: Path, name: str) -> bool:
    """Whether ``map`` with ``cache_file_name=cache_dir/name.arrow`` will read its result rather than compute it:
    the one file, or a whole set of the files it writes when it runs in N processes (datasets' default
    ``suffix_template``: ``name_00000_of_00002.arrow``, ...), whatever N this run would use (datasets reads the most
    complete set there is)."""
    if (cache_dir / f"{name}.arrow").exists():
        return True
    shards: dict[int, set[int]] = {}
    for path in cache_dir.glob(f"{name}_*_of_*.arrow"):
        rank, _, count = path.name[len(name) + 1 : -len(".arrow")].partition("_of_")
        if rank.isdigit() and count.isdigit():
            shards.setdefault(int(count), set()).add(int(rank))
    return any(ranks == set(range(count)) for count, ranks in shards.items())


class IndexedExamples:
    """A tokenized split whose examples carry their position as ``sample_index`` (what the collator keys its
    masks on), computed when read: a stored column would cost a full rewrite of the split or 8 bytes per example
    in memory. A map-style dataset for the DataLoader (len, getitem and the batched getitems torch uses)."""

    def __init__(self, examples: Dataset, cached: bool = False) -> None:
        self.examples = examples
        self.cached = cached  # read from the tokenized cache (not tokenized by this run)

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


def joined(parts: Iterable[IndexedExamples]) -> IndexedExamples:
    """Tokenized splits one after another (a mixture's held-out parts as one set), positions counted anew."""
    return IndexedExamples(concatenate_datasets([part.examples for part in parts]))


def tokenize(data: DataArguments, raw: RawData, tokenizer: Any) -> dict[str, IndexedExamples]:
    """Tokenize every split of ``raw`` the way ``data`` says (cached); its examples carry a ``sample_index``."""
    column = data.text_column
    key = cache_key(
        CACHE_VERSION,
        raw.fingerprint,
        tokenizer_fingerprint(tokenizer),
        data.padding,
        data.max_seq_length,
        column,
    )
    cache_dir = cache_root() / "tokenized"
    cache_dir.mkdir(parents=True, exist_ok=True)

    def encode(batch: dict[str, list[str]]) -> pa.Table:
        return encode_columns(tokenizer, batch[column], data, count_cut=True)  # strings only: load_raw dropped the rest

    result = {}
    for split, dataset in raw.splits.items():
        workers = preprocessing_workers(data.preprocessing_num_workers, len(dataset))
        last_step = "packed" if Padding(data.padding).packs else "tok"
        cached = in_cache(cache_dir, f"{key}-{split}-{last_step}")
        tokenized = dataset.map(
            encode,
            batched=True,
            remove_columns=dataset.column_names,
            num_proc=workers,
            cache_file_name=str(cache_dir / f"{key}-{split}-tok.arrow"),
            desc=f"Tokenizing {split}",
        )
        if Padding(data.padding).packs:
            tokenized = tokenized.map(
                group_texts,
                batched=True,
                fn_kwargs={"block": data.max_seq_length},
                num_proc=workers,
                cache_file_name=str(cache_dir / f"{key}-{split}-packed.arrow"),
                desc=f"Packing {split} into {data.max_seq_length}-token blocks",
            )
        if len(tokenized) == 0:
            raise ConfigError(
                f"{data.source_of('dataset')}: the {split} split has no complete {data.max_seq_length}-token "
                "block to pack; use padding dynamic or a smaller max_seq_length"
            )
        result[split] = IndexedExamples(tokenized, cached)
    return result


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


def real_token_count(dataset: Any, pad_token_id: int) -> int:
    """Non-padding tokens in a tokenized split (what tokens/s figures count), counted by Arrow, not per token."""
    table = _table(dataset)
    if table is None:
        return 0
    tokens = pc.list_flatten(table.column("input_ids"))
    return int(pc.sum(pc.not_equal(tokens, pad_token_id)).as_py() or 0)


def _table(dataset: Any) -> pa.Table | None:
    """The Arrow table behind a tokenized split (its rows in order, a selection's included), or None for a
    stream. Without a selection this is the dataset's own table, sliced whole: no copy."""
    base = dataset.examples if isinstance(dataset, IndexedExamples) else dataset
    if not isinstance(base, Dataset):
        return None
    return base.with_format("arrow")[:]
