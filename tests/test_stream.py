"""Compressed files and globs in both modes, and the streaming pipeline: split across ranks, resumed exactly."""

from __future__ import annotations

import bz2
import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from torchdata.stateful_dataloader import StatefulDataLoader

from tests.test_data import LINES, config_for
from train.data import SAMPLE_INDEX, data_format, load_raw, shown_url
from train.errors import ConfigError
from train.model import train_wordpiece
from train.stream import content_index, load_stream_raw, tokenized_stream

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def corpus_line(i: int) -> str:
    """A distinct line per i, so that a repeated or skipped example changes what a run sees."""
    return f"document {i} " + " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(3 + i % 11))


def write_compressed(tmp_path: Path) -> dict[str, Path]:
    paths = {}
    text = "\n".join(LINES) + "\n"
    (tmp_path / "c.txt.gz").write_bytes(gzip.compress(text.encode()))
    paths["txt.gz"] = tmp_path / "c.txt.gz"
    rows = "\n".join(json.dumps({"text": t}) for t in LINES) + "\n"
    (tmp_path / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(rows.encode()))
    paths["jsonl.zst"] = tmp_path / "c.jsonl.zst"
    table = "text\n" + "\n".join(f'"{t}"' for t in LINES) + "\n"
    (tmp_path / "c.csv.bz2").write_bytes(bz2.compress(table.encode()))
    paths["csv.bz2"] = tmp_path / "c.csv.bz2"
    pq.write_table(pa.table({"text": LINES}), str(tmp_path / "c.parquet"), compression="zstd")
    paths["parquet-zstd"] = tmp_path / "c.parquet"
    return paths


def write_shards(directory: Path, shards: int, per_shard: int) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    lines = [corpus_line(i) for i in range(shards * per_shard)]
    for s in range(shards):
        part = lines[s * per_shard : (s + 1) * per_shard]
        rows = "\n".join(json.dumps({"text": t}) for t in part) + "\n"
        (directory / f"part-{s}.jsonl.gz").write_bytes(gzip.compress(rows.encode()))
    return lines


def test_format_looks_through_one_compression_suffix() -> None:
    assert data_format("a/b/corpus.jsonl.zst") == "json"
    assert data_format("corpus.v2.TXT.GZ") == "text"
    assert data_format("x.parquet") == "parquet"
    assert data_format("x.gz") is None and data_format("x.docx") is None
    assert shown_url("https://user:secret@host/data.txt") == "https://host/data.txt"


@pytest.mark.parametrize("kind", ["txt.gz", "jsonl.zst", "csv.bz2", "parquet-zstd"])
@pytest.mark.parametrize("streaming", [False, True])
def test_compressed_files_in_both_modes(tmp_path: Path, kind: str, streaming: bool) -> None:
    path = write_compressed(tmp_path)[kind]
    if streaming:
        config = config_for(str(path), streaming="true", max_steps="5", max_eval_samples="5")
        stream, raw = load_stream_raw(config)
        texts = list(raw.splits["validation"]["text"]) + list(stream.texts())
        assert texts == LINES
    else:
        raw = load_raw(config_for(str(path), validation_split_percentage="10"))
        assert sorted(list(raw.splits["train"]["text"]) + list(raw.splits["validation"]["text"])) == sorted(LINES)


def test_a_glob_and_a_directory_of_compressed_files(tmp_path: Path) -> None:
    lines = write_shards(tmp_path / "corpus", shards=3, per_shard=20)
    (tmp_path / "corpus" / "README.md").write_text("not data")  # a directory's other files are not the corpus
    for source in (tmp_path / "corpus", tmp_path / "corpus" / "part-*.jsonl.gz"):
        raw = load_raw(config_for(str(source), validation_split_percentage="10"))
        assert list(raw.splits["train"]["text"]) + list(raw.splits["validation"]["text"]) == lines
    with pytest.raises(ConfigError, match=r"MLM_DATASET=.*nothing-\*\.txt.*matches no file"):
        load_raw(config_for(str(tmp_path / "nothing-*.txt")))


def test_streaming_needs_max_steps_and_something_to_evaluate(tmp_path: Path) -> None:
    write_shards(tmp_path / "corpus", shards=1, per_shard=10)
    with pytest.raises(ConfigError, match=r"MLM_STREAMING='true': expected with max_steps.*set max_steps"):
        config_for(str(tmp_path / "corpus"), streaming="true")
    with pytest.raises(ConfigError, match=r"MLM_STREAMING=true: .*set max_eval_samples.*validation_file"):
        load_stream_raw(config_for(str(tmp_path / "corpus"), streaming="true", max_steps="3"))
    with pytest.raises(ConfigError, match=r"no column 'body' \(columns: text\); set MLM_TEXT_COLUMN"):
        load_stream_raw(
            config_for(
                str(tmp_path / "corpus"), streaming="true", max_steps="3", text_column="body", eval_strategy="no"
            )
        )


def prepared(source: Path, **env: str):
    """A streaming config for ``source``, its stream and a tokenizer trained on the stream's sample."""
    config = config_for(str(source), streaming="true", max_steps="10", max_eval_samples="4", max_seq_length="32", **env)
    stream, raw = load_stream_raw(config)
    return config, stream, train_wordpiece(raw, config)


def examples_of(source: Path, rank: int, world: int) -> list[list[int]]:
    config, stream, tokenizer = prepared(source)
    return [row["input_ids"] for row in tokenized_stream(config, stream, tokenizer, rank, world)]


@pytest.mark.parametrize("shards", [4, 3])  # whole files per rank; every other example when they do not divide
def test_ranks_read_disjoint_parts_that_cover_the_stream(tmp_path: Path, shards: int) -> None:
    write_shards(tmp_path / "corpus", shards=shards, per_shard=12)
    everything = examples_of(tmp_path / "corpus", 0, 1)
    parts = [examples_of(tmp_path / "corpus", rank, 2) for rank in (0, 1)]
    assert sorted(map(tuple, parts[0] + parts[1])) == sorted(map(tuple, everything))
    assert not set(map(tuple, parts[0])) & set(map(tuple, parts[1]))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("padding", ["dynamic", "packed"])
def test_a_resumed_stream_sees_exactly_the_examples_an_uninterrupted_one_sees(
    tmp_path: Path, workers: int, padding: str
) -> None:
    """The position a checkpoint saves (StatefulDataLoader.state_dict) continues the stream with no example
    repeated or skipped, DataLoader workers included."""
    write_shards(tmp_path / "corpus", shards=2, per_shard=40)

    def loader(state=None):
        config, stream, tokenizer = prepared(tmp_path / "corpus", padding=padding)
        data = tokenized_stream(config, stream, tokenizer, 0, 1)
        made = StatefulDataLoader(data, batch_size=4, collate_fn=lambda rows: rows, num_workers=workers)
        if state is not None:
            made.load_state_dict(state)
        return made

    def indices(batches) -> list[int]:
        return [row[SAMPLE_INDEX] for batch in batches for row in batch]

    straight = indices(loader())
    assert len(straight) > 12 and len(set(straight)) == len(straight)
    first = loader()
    seen = []
    for n, batch in enumerate(first):
        seen.append(batch)
        if n == 2:
            break
    state = first.state_dict()
    assert indices(seen) + indices(loader(state)) == straight


def test_a_stream_examples_index_is_its_content() -> None:
    assert content_index([1, 2, 3]) == content_index([1, 2, 3]) != content_index([1, 2, 4])
    assert 0 <= content_index(list(range(512))) < 2**63
