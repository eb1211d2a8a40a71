"""train.data.corpus: the one value the job builds its Trainer from, in memory or streamed, and what it reports."""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets import IterableDataset

from tests.data.helpers import config_for, jsonl, write_shards
from train.common.errors import ConfigError
from train.data import (
    Corpus,
    IndexedExamples,
    build_corpus,
    check_stream_parts,
    load_raw,
    no_training_example,
    real_token_count,
    truncation,
)
from train.model.tokenizer_training import train_tokenizer

LONG = ["one two three four five six seven eight nine ten eleven twelve", "short one", "a b c d e f g h i j k"]


def built(config, rank: int = 0, world_size: int = 1) -> Corpus:
    raw = load_raw(config.data, config.training)
    return build_corpus(
        config.data, raw, train_tokenizer(raw, config.model, config.data), rank, world_size, config.training.seed
    )


def test_an_in_memory_corpus_knows_its_size_tokens_and_cuts(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = config_for(jsonl(tmp_path, "long.jsonl", LONG * 10), max_seq_length="8", tokenizer_vocab_size="200")
    raw = load_raw(config.data, config.training)
    tokenizer = train_tokenizer(raw, config.model, config.data)
    corpus = build_corpus(config.data, raw, tokenizer, 0, 1, config.training.seed)
    assert not corpus.streaming and isinstance(corpus.train, IndexedExamples)
    assert isinstance(corpus.validation, IndexedExamples) and corpus.fingerprint == raw.fingerprint
    assert (corpus.train_samples, corpus.eval_samples) == (24, 6)  # the seed's 80/20 hold-out
    assert corpus.train_real_tokens == real_token_count(corpus.train, tokenizer.pad_token_id) > 0
    assert corpus.truncation == truncation(corpus.train) and corpus.truncation["examples_cut"] > 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "training examples are longer than max_seq_length=8 and were cut" in warnings[0]
    assert f"{corpus.truncation['examples_cut']:,} of 24 training examples" in warnings[0]


def test_only_world_rank_0_warns_of_truncation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    config = config_for(jsonl(tmp_path, "long.jsonl", LONG * 10), max_seq_length="8", tokenizer_vocab_size="200")
    monkeypatch.setenv("RANK", "1")
    assert built(config).truncation["examples_cut"] > 0  # type: ignore[index]
    assert "were cut" not in capsys.readouterr().err


def test_nothing_cut_says_nothing(capsys: pytest.CaptureFixture) -> None:
    corpus = built(config_for("demo", demo_samples="50", tokenizer_vocab_size="100", eval_strategy="no"))
    assert corpus.truncation == {"examples_cut": 0, "tokens_cut": 0}
    assert "were cut" not in capsys.readouterr().err


def test_a_streamed_corpus_is_this_ranks_part_and_a_tokenized_evaluation_set(tmp_path: Path) -> None:
    write_shards(tmp_path / "corpus", shards=2, per_shard=20)
    config = config_for(
        str(tmp_path / "corpus"), streaming="true", max_steps="3", max_eval_samples="6", max_seq_length="32"
    )
    corpus = built(config, rank=1, world_size=2)
    assert corpus.streaming and isinstance(corpus.train, IterableDataset)
    assert (corpus.train_samples, corpus.train_real_tokens, corpus.truncation) == (None, None, None)
    assert isinstance(corpus.validation, IndexedExamples) and corpus.eval_samples == 6
    assert corpus.fingerprint.startswith("stream-")
    assert 0 < len(list(corpus.train)) < 40 - 6  # one file of two: rank 1's half, less what was held out


def test_a_stream_without_evaluation_has_none(tmp_path: Path) -> None:
    write_shards(tmp_path / "corpus", shards=1, per_shard=10)
    corpus = built(config_for(str(tmp_path / "corpus"), streaming="true", max_steps="3", eval_strategy="no"))
    assert corpus.validation is None and corpus.eval_samples == 0


def test_a_stream_with_examples_for_this_rank_passes_the_check(tmp_path: Path) -> None:
    write_shards(tmp_path / "corpus", shards=1, per_shard=10)
    config = config_for(str(tmp_path / "corpus"), streaming="true", max_steps="3", eval_strategy="no")
    check_stream_parts(config.data, built(config))  # no process group: this rank is the world


def test_a_stream_all_held_out_is_refused_before_training(tmp_path: Path) -> None:
    write_shards(tmp_path / "corpus", shards=1, per_shard=10)
    config = config_for(str(tmp_path / "corpus"), streaming="true", max_steps="3", max_eval_samples="20")
    with pytest.raises(ConfigError) as refused:
        check_stream_parts(config.data, built(config))
    said = str(refused.value)
    assert said.startswith("MLM_STREAMING=true: the training stream gave no example: MLM_MAX_EVAL_SAMPLES=20 holds")
    assert "ranks" not in said


def test_the_error_names_the_ranks_left_without_examples(tmp_path: Path) -> None:
    config = config_for(str(tmp_path), streaming="true", max_steps="3", validation_file="held.txt")
    said = str(no_training_example(config.data, [1, 3], 4))
    assert "gives rank(s) 1, 3 of 4 no example" in said and "holds out" not in said and "or fewer ranks)" in said
