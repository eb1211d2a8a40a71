"""Every data source and padding mode, and the one-line errors for bad data."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from train.config import load_config
from train.data import DEMO_SENTENCE, SAMPLE_INDEX, load_raw, real_token_count, tokenize, truncation
from train.errors import ConfigError
from train.model import train_wordpiece

LINES = [f"line number {i} of the local corpus" + " with more words" * (i % 5) for i in range(50)]


def config_for(dataset: str, **env: str):
    return load_config([], {"MLM_DATASET": dataset, **{f"MLM_{k.upper()}": v for k, v in env.items()}})


def write_formats(tmp_path: Path) -> dict[str, Path]:
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


def test_demo_is_the_seed_data_split_80_20() -> None:
    raw = load_raw(config_for("demo"))
    assert len(raw.splits["train"]) == 40000 and len(raw.splits["validation"]) == 10000
    assert raw.splits["train"][0]["text"] == DEMO_SENTENCE


@pytest.mark.parametrize("kind", ["txt", "jsonl", "json", "csv", "parquet", "save_to_disk", "directory"])
def test_each_local_format(tmp_path: Path, kind: str) -> None:
    path = write_formats(tmp_path)[kind]
    raw = load_raw(config_for(str(path), validation_split_percentage="10"))
    assert raw.splits["train"].column_names == ["text"]
    assert len(raw.splits["train"]) == 45 and len(raw.splits["validation"]) == 5
    assert sorted(list(raw.splits["train"]["text"]) + list(raw.splits["validation"]["text"])) == sorted(LINES)


def test_validation_file_replaces_the_split(tmp_path: Path) -> None:
    paths = write_formats(tmp_path)
    raw = load_raw(config_for(str(paths["txt"]), validation_file=str(paths["csv"])))
    assert len(raw.splits["train"]) == 50 and len(raw.splits["validation"]) == 50


def test_padding_modes_keep_the_same_real_tokens(tmp_path: Path) -> None:
    path = write_formats(tmp_path)["txt"]
    results = {}
    for padding in ("dynamic", "max_length", "packed"):
        config = config_for(str(path), padding=padding, max_seq_length="32", tokenizer_vocab_size="200")
        raw = load_raw(config)
        tokenizer = train_wordpiece(raw, config)
        results[padding] = (tokenize(config, raw, tokenizer)["train"], tokenizer.pad_token_id)
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


def test_tokenization_is_cached(tmp_path: Path, hf_home: Path) -> None:
    config = config_for("demo", demo_samples="300", tokenizer_vocab_size="100")
    raw = load_raw(config)
    tokenizer = train_wordpiece(raw, config)
    first = tokenize(config, raw, tokenizer)["train"]
    second = tokenize(config, load_raw(config), train_wordpiece(load_raw(config), config))["train"]
    assert first.cache_files and first.cache_files[0]["filename"] == second.cache_files[0]["filename"]
    assert str(hf_home) in first.cache_files[0]["filename"]


def bad(tmp_path: Path, name: str, content: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content)
    return str(path)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: str(p / "nope.txt"), r"MLM_DATASET='.*nope.txt': no such file or directory"),
        (lambda p: bad(p, "empty.txt", b""), r"MLM_DATASET='.*empty.txt': the file is empty"),
        (
            lambda p: bad(p, "other.jsonl", b'{"body": "x"}\n'),
            r"no column 'text' \(columns: body\); set MLM_TEXT_COLUMN",
        ),
        (lambda p: bad(p, "data.xml", b"<a/>"), r"unsupported extension '.xml'"),
        (lambda p: bad(p, "corrupt.jsonl", b'{"text": "ok"}\n{"text": broken\n'), r"corrupt.jsonl': cannot be read"),
        (lambda p: bad(p, "corrupt.parquet", b"PAR1 this is not parquet"), r"corrupt.parquet': cannot be read"),
    ],
)
def test_bad_data_is_one_clear_line(tmp_path: Path, make, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_raw(config_for(make(tmp_path)))
    assert "\n" not in str(info.value)


def test_hub_dataset_offline_says_so() -> None:
    with pytest.raises(
        ConfigError, match=r"MLM_DATASET='someone/corpus': cannot load the hub dataset \(HF_HUB_OFFLINE"
    ):
        load_raw(config_for("someone/corpus"))


def jsonl(tmp_path: Path, name: str, texts: list) -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def test_rows_without_text_are_skipped_with_one_warning(
    tmp_path: Path, hf_home: Path, capsys: pytest.CaptureFixture
) -> None:
    texts = [*LINES[:8], None, 5, {"a": 1}, *LINES[8:10]]  # mixed types: datasets reads the column as Json
    validation = jsonl(tmp_path, "eval.jsonl", [LINES[0], None, LINES[1]])
    config = config_for(jsonl(tmp_path, "mixed.jsonl", texts), validation_file=validation, tokenizer_vocab_size="200")
    raw = load_raw(config)
    assert list(raw.splits["train"]["text"]) == LINES[:10]
    assert list(raw.splits["validation"]["text"]) == LINES[:2]
    err = capsys.readouterr().err
    assert "Dropping rows without text" in err  # the filter's progress bar
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 2
    assert "MLM_DATASET=" in warnings[0] and "skipped 3 of 13 rows whose 'text' is null or not a string" in warnings[0]
    assert "MLM_VALIDATION_FILE=" in warnings[1] and "skipped 1 of 3 rows" in warnings[1]
    tokenized = tokenize(config, raw, train_wordpiece(raw, config))
    assert len(tokenized["train"]) == 10 and all(len(ids) > 2 for ids in tokenized["train"]["input_ids"])
    # a second load reuses the filter's result, cached under HF_HOME, and says the same
    capsys.readouterr()
    again = load_raw(config)
    err = capsys.readouterr().err
    assert "Dropping rows" not in err and "skipped 3 of 13 rows" in err
    assert again.fingerprint == raw.fingerprint and list(again.splits["train"]["text"]) == LINES[:10]
    assert any(
        str(hf_home) in f["filename"] and "/filtered/" in f["filename"] for f in again.splits["train"].cache_files
    )


def test_null_rows_in_csv_and_string_columns(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    csv = tmp_path / "c.csv"
    csv.write_text("text,id\n" + "".join(f'"{t}",{i}\n' for i, t in enumerate(LINES[:4])) + ",9\n")
    assert (
        list(
            load_raw(config_for(str(csv), validation_split_percentage="0", eval_strategy="no")).splits["train"]["text"]
        )
        == LINES[:4]
    )
    assert "skipped 1 of 5 rows" in capsys.readouterr().err
    clean = load_raw(
        config_for(jsonl(tmp_path, "clean.jsonl", LINES[:4]), validation_split_percentage="0", eval_strategy="no")
    )
    assert len(clean.splits["train"]) == 4 and "warning" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        ([None, None], r"MLM_DATASET='.*nulls.jsonl': no text: column 'text' is null or not a string in all 2 rows"),
        ([None, 3, [1]], r"MLM_DATASET='.*nulls.jsonl': no text: column 'text' is null or not a string in all 3"),
        ([1, 2], r"MLM_DATASET='.*nulls.jsonl': column 'text' holds int64, not text; set MLM_TEXT_COLUMN"),
    ],
)
def test_a_source_without_text_is_an_error(tmp_path: Path, texts: list, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_raw(config_for(jsonl(tmp_path, "nulls.jsonl", texts)))
    assert info.value.exit_code == 2 and "\n" not in str(info.value)


def test_hub_splits_drop_rows_without_text_in_the_splits_used(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    hub = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": [*LINES[:4], None]}),
            "validation": datasets.Dataset.from_dict({"text": LINES[4:6]}),
            "test": datasets.Dataset.from_dict({"text": [None, None]}),  # unused: neither an error nor a warning
        }
    )
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: hub)
    raw = load_raw(config_for("someone/corpus"))
    assert list(raw.splits["train"]["text"]) == LINES[:4] and list(raw.splits["validation"]["text"]) == LINES[4:6]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [
        "mlm-trainer: warning: MLM_DATASET='someone/corpus' (train split): skipped 1 of 5 rows whose 'text' is null "
        "or not a string"
    ]


def test_a_corpus_too_small_to_hold_out_evaluation_data_is_a_config_error(tmp_path):
    corpus = tmp_path / "one.txt"
    corpus.write_text("one long line of text that is the whole corpus\n")
    config = load_config(["--dataset", str(corpus), "--output_dir", str(tmp_path / "out")], {})
    with pytest.raises(ConfigError, match=r"validation_split_percentage=20: holds out no example of the 1 training"):
        load_raw(config)
    quiet = load_config(["--dataset", str(corpus), "--output_dir", str(tmp_path / "o"), "--eval_strategy", "no"], {})
    assert "validation" not in load_raw(quiet).splits


def test_a_file_that_is_not_utf8_names_its_line(tmp_path):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes("first line\nsecond line\ncaf\xe9 au lait\n".encode("latin-1"))
    config = load_config(["--dataset", str(corpus), "--output_dir", str(tmp_path / "out")], {})
    with pytest.raises(ConfigError, match=r"not UTF-8 \(line 3\); expected UTF-8 text"):
        load_raw(config)


def test_truncation_is_counted_per_example(tmp_path):
    texts = ["one two three four five six seven eight nine ten eleven twelve", "short one", "a b c d e f g h i j k"]
    path = jsonl(tmp_path, "long.jsonl", texts * 4)
    config = config_for(path, max_seq_length="8", validation_split_percentage="0", eval_strategy="no")
    raw = load_raw(config)
    tokenizer = train_wordpiece(raw, config)
    train = tokenize(config, raw, tokenizer)["train"]
    assert len(train) == 12 and max(len(ids) for ids in train["input_ids"]) == 8  # one row per example, cut
    full = [len(tokenizer(t)["input_ids"]) - 2 for t in texts * 4]  # text tokens without [CLS] [SEP]
    expected = sum(max(n - 6, 0) for n in full)
    assert truncation(train) == {"examples_cut": sum(1 for n in full if n > 6), "tokens_cut": expected}
    assert expected > 0
