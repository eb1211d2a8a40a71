"""Corpora the data tests (and the end-to-end runs of a stream or of S3 data) write: every format, compressed
files, and shards of distinct lines."""

from __future__ import annotations

import bz2
import gzip
import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from train.config import Config, load_config
from train.data import RawData, load_raw

LINES = [f"line number {i} of the local corpus" + " with more words" * (i % 5) for i in range(50)]
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def config_for(dataset: str, **env: str) -> Config:
    return load_config([], {"MLM_DATASET": dataset, **{f"MLM_{k.upper()}": v for k, v in env.items()}})


def raw_of(config: Config) -> RawData:
    """load_raw of ``config``'s data section (its TrainingArguments say whether anything is evaluated)."""
    return load_raw(config.data, config.training)


def write_formats(tmp_path: Path) -> dict[str, Path]:
    """LINES in each format the job reads, a save_to_disk directory and a directory of two text shards."""
    paths = {}
    (tmp_path / "c.txt").write_text("\n".join(LINES) + "\n")
    paths["txt"] = tmp_path / "c.txt"
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate(LINES)))
    paths["jsonl"] = tmp_path / "c.jsonl"
    (tmp_path / "c.json").write_text(json.dumps([{"text": t} for t in LINES]))
    paths["json"] = tmp_path / "c.json"
    (tmp_path / "c.csv").write_text("text,id\n" + "\n".join(f'"{t}",{i}' for i, t in enumerate(LINES)) + "\n")
    paths["csv"] = tmp_path / "c.csv"
    datasets.Dataset.from_dict({"text": LINES}).to_parquet(str(tmp_path / "c.parquet"))
    paths["parquet"] = tmp_path / "c.parquet"
    datasets.Dataset.from_dict({"text": LINES}).save_to_disk(str(tmp_path / "saved"))
    paths["save_to_disk"] = tmp_path / "saved"
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "a.txt").write_text("\n".join(LINES[:25]) + "\n")
    (shards / "b.txt").write_text("\n".join(LINES[25:]) + "\n")
    paths["directory"] = shards
    return paths


def write_compressed(tmp_path: Path) -> dict[str, Path]:
    """LINES compressed three ways, and a zstd-compressed parquet file."""
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


def jsonl(tmp_path: Path, name: str, texts: list) -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def corpus_line(i: int) -> str:
    """A distinct line per i, so that a repeated or skipped example changes what a run sees."""
    return f"document {i} " + " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(3 + i % 11))


def write_shards(directory: Path, shards: int, per_shard: int) -> list[str]:
    """``shards`` gzipped JSON-lines files of distinct lines; the lines, in order."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = [corpus_line(i) for i in range(shards * per_shard)]
    for s in range(shards):
        part = lines[s * per_shard : (s + 1) * per_shard]
        rows = "\n".join(json.dumps({"text": t}) for t in part) + "\n"
        (directory / f"part-{s}.jsonl.gz").write_bytes(gzip.compress(rows.encode()))
    return lines


def bad(tmp_path: Path, name: str, content: bytes) -> str:
    """A file of ``content`` (a corpus the loaders must refuse); its path."""
    path = tmp_path / name
    path.write_bytes(content)
    return str(path)
