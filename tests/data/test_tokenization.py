"""train.data.tokenization: the padding modes, the cache, packing, truncation counts and the tokenization workers."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import datasets
import pytest

from tests.data.helpers import config_for, jsonl, write_formats
from train.common.errors import ConfigError
from train.config import DataArguments
from train.data import SAMPLE_INDEX, load_raw, real_token_count, tokenization, tokenize, truncation
from train.data.padding import Padding
from train.data.tokenization import (
    CUT_TOKENS,
    MIN_ROWS_PER_WORKER,
    IndexedExamples,
    encode_texts,
    group_texts,
    preprocessing_workers,
    tokenizer_fingerprint,
)
from train.model.tokenizer_training import BPE, UNIGRAM, WORDPIECE, train_tokenizer

# Long lines that max_seq_length=16 cuts (one into several overflow rows), empty and blank lines, unicode (accents
# composed and combining, CJK, emoji, right-to-left, a zero-width joiner) and special tokens written in the text.
AWKWARD = [
    "the quick brown fox jumps over the lazy dog " * 6,
    "",
    "   ",
    "Café naïve façade – déjà vu; cafe\u0301 nai\u0308ve",
    "東京は日本の首都です。北京是中国的首都。",
    "emoji 👩‍💻 and 🇫🇷 flags, שלום עולם, مرحبا بالعالم",
    "a [SEP] in the text, a [MASK] and <s> too",
    "short",
    "x " * 40,
    "\t tabs\tand\u00a0non-breaking spaces\u2003here",
]


def test_padding_modes_keep_the_same_real_tokens(tmp_path: Path) -> None:
    path = write_formats(tmp_path)["txt"]
    results = {}
    for padding in ("dynamic", "max_length", "packed"):
        config = config_for(str(path), padding=padding, max_seq_length="32", tokenizer_vocab_size="200")
        raw = load_raw(config.data, config.training)
        tokenizer = train_tokenizer(raw, config.model, config.data)
        results[padding] = (tokenize(config.data, raw, tokenizer)["train"], tokenizer.pad_token_id)
    dynamic, pad = results["dynamic"]
    padded, _ = results["max_length"]
    packed, _ = results["packed"]
    assert {len(ids) for ids in padded["input_ids"]} == {32}
    assert len({len(ids) for ids in dynamic["input_ids"]}) > 1 and max(len(i) for i in dynamic["input_ids"]) < 32
    assert real_token_count(dynamic, pad) == real_token_count(padded, pad)
    assert {len(ids) for ids in packed["input_ids"]} == {32}
    # packing drops only the last incomplete block
    assert 0 <= real_token_count(dynamic, pad) - real_token_count(packed, pad) < 32
    for split in (dynamic, padded, packed):
        assert list(split[SAMPLE_INDEX]) == list(range(len(split)))


def test_tokenization_is_cached(hf_home: Path) -> None:
    config = config_for("demo", demo_samples="300", tokenizer_vocab_size="100")
    raw = load_raw(config.data, config.training)
    tokenizer = train_tokenizer(raw, config.model, config.data)
    first = tokenize(config.data, raw, tokenizer)["train"]
    second = tokenize(
        config.data,
        load_raw(config.data, config.training),
        train_tokenizer(load_raw(config.data, config.training), config.model, config.data),
    )["train"]
    assert first.cache_files and first.cache_files[0]["filename"] == second.cache_files[0]["filename"]
    assert str(hf_home) in first.cache_files[0]["filename"]
    other = config_for("demo", demo_samples="300", tokenizer_vocab_size="100", max_seq_length="64")
    assert tokenize(other.data, raw, tokenizer)["train"].cache_files[0]["filename"] != first.cache_files[0]["filename"]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_second_tokenization_says_it_read_the_cache(tmp_path: Path, workers: str) -> None:
    """In one process or in two (datasets then writes a file per process): what the start-up record notes."""
    texts = [f"line {i} of a corpus no other test tokenizes ({tmp_path.name})" for i in range(400)]
    config = config_for(
        jsonl(tmp_path, "corpus.jsonl", texts), tokenizer_vocab_size="100", preprocessing_num_workers=workers
    )
    raw = load_raw(config.data, config.training)
    tokenizer = train_tokenizer(raw, config.model, config.data)
    first = tokenize(config.data, raw, tokenizer)
    second = tokenize(config.data, raw, tokenizer)
    assert len(first["train"].cache_files) == int(workers)
    assert [split.cached for split in first.values()] == [False, False]
    assert [split.cached for split in second.values()] == [True, True]
    if workers == "2":  # a set that lost a file is tokenized again, in part: not read from the cache
        Path(first["train"].cache_files[1]["filename"]).unlink()
        assert not tokenize(config.data, raw, tokenizer)["train"].cached


def test_the_tokenizer_fingerprint_ignores_its_truncation_state() -> None:
    config = config_for("demo", demo_samples="50", tokenizer_vocab_size="100")
    tokenizer = train_tokenizer(load_raw(config.data, config.training), config.model, config.data)
    before = tokenizer_fingerprint(tokenizer)
    tokenizer(["a sentence"], truncation=True, max_length=4, padding="max_length")  # stored in the backend's state
    assert tokenizer_fingerprint(tokenizer) == before and len(before) == 20


def test_a_packed_split_without_a_whole_block_is_a_config_error() -> None:
    config = config_for("demo", demo_samples="10", padding="packed", max_seq_length="512", tokenizer_vocab_size="100")
    raw = load_raw(config.data, config.training)
    with pytest.raises(ConfigError, match=r"MLM_PADDING|no complete 512-token block to pack"):
        tokenize(config.data, raw, train_tokenizer(raw, config.model, config.data))


def test_truncation_is_counted_per_example(tmp_path: Path) -> None:
    texts = ["one two three four five six seven eight nine ten eleven twelve", "short one", "a b c d e f g h i j k"]
    path = jsonl(tmp_path, "long.jsonl", texts * 4)
    config = config_for(path, max_seq_length="8", validation_split_percentage="0", eval_strategy="no")
    raw = load_raw(config.data, config.training)
    tokenizer = train_tokenizer(raw, config.model, config.data)
    train = tokenize(config.data, raw, tokenizer)["train"]
    assert len(train) == 12 and max(len(ids) for ids in train["input_ids"]) == 8  # one row per example, cut
    full = [len(tokenizer(t)["input_ids"]) - 2 for t in texts * 4]  # text tokens without [CLS] [SEP]
    expected = sum(max(n - 6, 0) for n in full)
    assert truncation(train) == {"examples_cut": sum(1 for n in full if n > 6), "tokens_cut": expected}
    assert expected > 0


def test_group_texts_cuts_whole_blocks_and_drops_the_tail() -> None:
    examples = {"input_ids": [[1, 2, 3], [4, 5], [6, 7, 8, 9]], CUT_TOKENS: [0, 0, 0]}
    # 9 is the dropped tail; each block says its documents' (pieces') lengths: [1, 2, 3 | 4], [5 | 6, 7, 8]
    assert group_texts(examples, 4) == {"input_ids": [[1, 2, 3, 4], [5, 6, 7, 8]], "document_lengths": [[3, 1], [1, 3]]}
    assert group_texts({"input_ids": [[1]]}, 4) == {"input_ids": [], "document_lengths": []}
    long = group_texts({"input_ids": [list(range(10)), [10, 11]]}, 4)  # one document over three blocks
    assert long["document_lengths"] == [[4], [4], [2, 2]]


def test_indexed_examples_carry_their_position() -> None:
    indexed = IndexedExamples(datasets.Dataset.from_dict({"input_ids": [[1], [2], [3]]}))
    assert len(indexed) == 3 and indexed.column_names == ["input_ids", SAMPLE_INDEX]
    assert indexed[1] == {"input_ids": [2], SAMPLE_INDEX: 1}
    assert indexed.__getitems__([2, 0]) == [{"input_ids": [3], SAMPLE_INDEX: 2}, {"input_ids": [1], SAMPLE_INDEX: 0}]
    assert list(indexed[SAMPLE_INDEX]) == [0, 1, 2] and indexed.num_rows == 3  # the split's own attributes


def test_workers_follow_the_usable_cpus_and_the_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokenization, "usable_cpus", lambda: 8)
    unset = config_for("demo").data.preprocessing_num_workers
    assert preprocessing_workers(unset, 3 * MIN_ROWS_PER_WORKER) == 3  # each worker gets enough rows
    assert preprocessing_workers(unset, 100 * MIN_ROWS_PER_WORKER) == 8  # no more than the CPUs
    assert preprocessing_workers(unset, MIN_ROWS_PER_WORKER) is None  # one: this process, not a pool of one
    assert (
        preprocessing_workers(config_for("demo", preprocessing_num_workers="5").data.preprocessing_num_workers, 10) == 5
    )


def test_a_stream_has_no_table_to_count() -> None:
    stream = datasets.Dataset.from_dict({"input_ids": [[1, 0]]}).to_iterable_dataset()
    assert real_token_count(stream, 0) == 0 and truncation(stream) == {"examples_cut": 0, "tokens_cut": 0}


def transformers_encoding(tokenizer: Any, texts: list[str], data: DataArguments) -> dict[str, list]:
    """What tokenization stored before it went from the tokenizers library to Arrow itself (issue 70): transformers'
    call, its overflow rows counted as each example's cut tokens, then dropped."""
    padding = Padding(data.padding)
    if padding.packs:
        return dict(tokenizer(texts, return_special_tokens_mask=True, return_attention_mask=False, verbose=False))
    encoded = dict(
        tokenizer(
            texts,
            padding="max_length" if padding.pads_when_tokenized else False,
            truncation=True,
            max_length=data.max_seq_length,
            return_special_tokens_mask=True,
            return_attention_mask=padding.pads_when_tokenized,
            return_overflowing_tokens=True,
        )
    )
    mapping, masks = encoded.pop("overflow_to_sample_mapping"), encoded["special_tokens_mask"]
    first, cut = [], [0] * len(texts)
    for i, example in enumerate(mapping):
        if i and mapping[i - 1] == example:
            cut[example] += len(masks[i]) - sum(masks[i])
        else:
            first.append(i)
    return {**{key: [values[i] for i in first] for key, values in encoded.items()}, CUT_TOKENS: cut}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tokenizer of each kind trained on AWKWARD (so its scripts are in the vocabulary, not unknown), and a
    WordPiece one that returns token type ids (as BERT's) and cuts from the left."""
    corpus = jsonl(tmp_path_factory.mktemp("awkward"), "awkward.jsonl", AWKWARD * 20)
    config = config_for(corpus, tokenizer_vocab_size="300", validation_split_percentage="0", eval_strategy="no")
    raw = load_raw(config.data, config.training)
    trained = {kind.name: train_tokenizer(raw, config.model, config.data, kind) for kind in (WORDPIECE, BPE, UNIGRAM)}
    bert_like = copy.deepcopy(trained["wordpiece"])
    bert_like.model_input_names = ["input_ids", "token_type_ids", "attention_mask"]
    bert_like.truncation_side = "left"
    return {**trained, "bert-like": bert_like}


@pytest.mark.parametrize("padding", list(Padding))
@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram", "bert-like"])
def test_arrow_columns_hold_what_transformers_returned(tokenizers: dict[str, Any], kind: str, padding: str) -> None:
    """The same ids, masks and cut counts, column for column and in the same order, as transformers' call."""
    tokenizer = tokenizers[kind]
    data = config_for("demo", padding=padding, max_seq_length="16").data
    expected = transformers_encoding(tokenizer, AWKWARD, data)
    assert encode_texts(tokenizer, AWKWARD, data, count_cut=True) == expected
    assert list(expected) == list(encode_texts(tokenizer, AWKWARD, data, count_cut=False)) + (
        [] if Padding(padding).packs else [CUT_TOKENS]
    )
    if not Padding(padding).packs:
        assert expected[CUT_TOKENS][0] > 16 and expected[CUT_TOKENS][1:3] == [0, 0]  # cut over several rows


@pytest.mark.parametrize("padding", ["dynamic", "max_length", "packed"])
def test_the_tokenized_cache_has_the_column_types_it_had(tmp_path: Path, padding: str) -> None:
    """Arrow's types as datasets inferred them from transformers' lists (int32 ids, int8 masks, int64 cuts), so a
    cache written before reads the same as one written now: the cache key did not change."""
    config = config_for(jsonl(tmp_path, "awkward.jsonl", AWKWARD * 3), padding=padding, max_seq_length="16")
    raw = load_raw(config.data, config.training)
    tokenizer = train_tokenizer(raw, config.model, config.data)
    stored = tokenize(config.data, raw, tokenizer)["train"].examples
    before = raw.splits["train"].map(
        lambda batch: transformers_encoding(tokenizer, batch["text"], config.data),
        batched=True,
        remove_columns=["text"],
    )
    if Padding(padding).packs:
        before = before.map(group_texts, batched=True, fn_kwargs={"block": 16})
    assert stored.features == before.features and stored.to_dict() == before.to_dict()
