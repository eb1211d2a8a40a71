"""train.data.load: every source read and split in memory or streamed, rows without text, and the one-line errors
for data that cannot be read."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest

from tests.data.helpers import LINES, bad, config_for, jsonl, raw_of, write_compressed, write_formats, write_shards
from train.common.errors import ConfigError
from train.config import load_config
from train.data import DEMO_SENTENCE, load_raw


def test_demo_is_the_seed_data_split_80_20() -> None:
    raw = raw_of(config_for("demo"))
    assert len(raw.splits["train"]) == 40000 and len(raw.splits["validation"]) == 10000
    assert raw.splits["train"][0]["text"] == DEMO_SENTENCE
    assert raw.stream is None


@pytest.mark.parametrize("kind", ["txt", "jsonl", "json", "csv", "parquet", "save_to_disk", "directory"])
def test_each_local_format(tmp_path: Path, kind: str) -> None:
    path = write_formats(tmp_path)[kind]
    raw = raw_of(config_for(str(path), validation_split_percentage="10"))
    assert raw.splits["train"].column_names == ["text"]
    assert len(raw.splits["train"]) == 45 and len(raw.splits["validation"]) == 5
    assert sorted(list(raw.splits["train"]["text"]) + list(raw.splits["validation"]["text"])) == sorted(LINES)


def test_validation_file_replaces_the_split(tmp_path: Path) -> None:
    paths = write_formats(tmp_path)
    raw = raw_of(config_for(str(paths["txt"]), validation_file=str(paths["csv"])))
    assert len(raw.splits["train"]) == 50 and len(raw.splits["validation"]) == 50


@pytest.mark.parametrize("kind", ["txt.gz", "jsonl.zst", "csv.bz2", "parquet-zstd"])
@pytest.mark.parametrize("streaming", [False, True])
def test_compressed_files_in_both_modes(tmp_path: Path, kind: str, streaming: bool) -> None:
    path = write_compressed(tmp_path)[kind]
    if streaming:
        raw = raw_of(config_for(str(path), streaming="true", max_steps="5", max_eval_samples="5"))
        assert raw.stream is not None
        assert list(raw.splits["validation"]["text"]) + list(raw.stream.texts()) == LINES
    else:
        raw = raw_of(config_for(str(path), validation_split_percentage="10"))
        assert sorted(list(raw.splits["train"]["text"]) + list(raw.splits["validation"]["text"])) == sorted(LINES)


def test_a_glob_and_a_directory_of_compressed_files(tmp_path: Path) -> None:
    lines = write_shards(tmp_path / "corpus", shards=3, per_shard=20)
    (tmp_path / "corpus" / "README.md").write_text("not data")
    for source in (tmp_path / "corpus", tmp_path / "corpus" / "part-*.jsonl.gz"):
        raw = raw_of(config_for(str(source), validation_split_percentage="10"))
        assert list(raw.splits["train"]["text"]) + list(raw.splits["validation"]["text"]) == lines


def test_a_stream_of_a_saved_dataset_reads_its_rows(tmp_path: Path) -> None:
    """Both modes share one resolver: a save_to_disk directory streams its rows (it used to stream its .json
    metadata files as if they were the corpus)."""
    saved = str(write_formats(tmp_path)["save_to_disk"])
    raw = raw_of(config_for(saved, streaming="true", max_steps="5", max_eval_samples="4"))
    assert raw.stream is not None and raw.fingerprint.startswith("stream-")
    assert list(raw.splits["validation"]["text"]) == LINES[:4] and list(raw.stream.texts()) == LINES[4:]
    assert list(raw.splits["train"]["text"]) == LINES[4:]  # the sample a new tokenizer learns from


def test_the_demo_streams_in_shards() -> None:
    raw = raw_of(config_for("demo", streaming="true", max_steps="5", demo_samples="20", eval_strategy="no"))
    assert raw.stream is not None and raw.stream.rows.num_shards == 4  # split across ranks by whole shards
    assert list(raw.stream.texts()) == [DEMO_SENTENCE] * 20 and "validation" not in raw.splits


def test_a_stream_holds_out_its_first_examples_and_caps_training(tmp_path: Path) -> None:
    lines = write_shards(tmp_path / "corpus", shards=1, per_shard=30)
    raw = raw_of(
        config_for(
            str(tmp_path / "corpus"), streaming="true", max_steps="3", max_eval_samples="5", max_train_samples="10"
        )
    )
    assert raw.stream is not None and list(raw.splits["validation"]["text"]) == lines[:5]
    assert list(raw.stream.texts()) == lines[5:10]  # take(10) of the stream, less the held-out five
    validation = jsonl(tmp_path, "eval.jsonl", LINES[:3])
    with_file = raw_of(
        config_for(str(tmp_path / "corpus"), streaming="true", max_steps="3", validation_file=validation)
    )
    assert with_file.stream is not None and list(with_file.stream.texts()) == lines
    assert list(with_file.splits["validation"]["text"]) == LINES[:3]
    assert with_file.fingerprint != raw.fingerprint


def test_streaming_needs_something_to_evaluate_and_its_column(tmp_path: Path) -> None:
    write_shards(tmp_path / "corpus", shards=1, per_shard=10)
    with pytest.raises(ConfigError, match=r"MLM_STREAMING='true': expected with max_steps.*set max_steps"):
        config_for(str(tmp_path / "corpus"), streaming="true")
    with pytest.raises(ConfigError, match=r"MLM_STREAMING=true: .*set max_eval_samples.*validation_file"):
        raw_of(config_for(str(tmp_path / "corpus"), streaming="true", max_steps="3"))
    with pytest.raises(ConfigError, match=r"no column 'body' \(columns: text\); set MLM_TEXT_COLUMN"):
        raw_of(
            config_for(
                str(tmp_path / "corpus"), streaming="true", max_steps="3", text_column="body", eval_strategy="no"
            )
        )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: str(p / "nope.txt"), r"MLM_DATASET='.*nope.txt': no such file or directory"),
        (
            lambda p: bad(p, "other.jsonl", b'{"body": "x"}\n'),
            r"no column 'text' \(columns: body\); set MLM_TEXT_COLUMN",
        ),
        (lambda p: bad(p, "corrupt.jsonl", b'{"text": "ok"}\n{"text": broken\n'), r"corrupt.jsonl': cannot be read"),
        (lambda p: bad(p, "corrupt.parquet", b"PAR1 this is not parquet"), r"corrupt.parquet': cannot be read"),
    ],
)
def test_bad_data_is_one_clear_line(tmp_path: Path, make, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        raw_of(config_for(make(tmp_path)))
    assert "\n" not in str(info.value)


def test_hub_dataset_offline_says_so() -> None:
    with pytest.raises(
        ConfigError, match=r"MLM_DATASET='someone/corpus': cannot load the hub dataset \(HF_HUB_OFFLINE"
    ):
        raw_of(config_for("someone/corpus"))
    with pytest.raises(ConfigError, match=r"MLM_DATASET='someone/corpus': cannot stream the hub dataset"):
        raw_of(config_for("someone/corpus", streaming="true", max_steps="3", max_eval_samples="2"))


def test_rows_without_text_are_skipped_with_one_warning(
    tmp_path: Path, hf_home: Path, capsys: pytest.CaptureFixture
) -> None:
    texts = [*LINES[:8], None, 5, {"a": 1}, *LINES[8:10]]  # mixed types: datasets reads the column as Json
    validation = jsonl(tmp_path, "eval.jsonl", [LINES[0], None, LINES[1]])
    config = config_for(jsonl(tmp_path, "mixed.jsonl", texts), validation_file=validation, tokenizer_vocab_size="200")
    raw = load_raw(config.data, config.training)
    assert list(raw.splits["train"]["text"]) == LINES[:10]
    assert list(raw.splits["validation"]["text"]) == LINES[:2]
    err = capsys.readouterr().err
    assert "Dropping rows without text" in err  # the filter's progress bar
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 2
    assert "MLM_DATASET=" in warnings[0] and "skipped 3 of 13 rows whose 'text' is null or not a string" in warnings[0]
    assert "MLM_VALIDATION_FILE=" in warnings[1] and "skipped 1 of 3 rows" in warnings[1]
    # a second load reuses the filter's result, cached under HF_HOME, and says the same
    again = load_raw(config.data, config.training)
    err = capsys.readouterr().err
    assert "Dropping rows" not in err and "skipped 3 of 13 rows" in err
    assert again.fingerprint == raw.fingerprint and list(again.splits["train"]["text"]) == LINES[:10]
    assert any(
        str(hf_home) in f["filename"] and "/filtered/" in f["filename"] for f in again.splits["train"].cache_files
    )


def test_only_world_rank_0_warns_of_skipped_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    config = config_for(
        jsonl(tmp_path, "nulls.jsonl", [*LINES[:4], None]), validation_split_percentage="0", eval_strategy="no"
    )
    monkeypatch.setenv("RANK", "1")  # before the process group starts, torchrun's RANK says who this is
    assert len(load_raw(config.data, config.training).splits["train"]) == 4
    assert "skipped" not in capsys.readouterr().err
    monkeypatch.setenv("RANK", "0")
    load_raw(config.data, config.training)
    assert "skipped 1 of 5 rows" in capsys.readouterr().err


def test_null_rows_in_csv_and_string_columns(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    csv = tmp_path / "c.csv"
    csv.write_text("text,id\n" + "".join(f'"{t}",{i}\n' for i, t in enumerate(LINES[:4])) + ",9\n")
    only = config_for(str(csv), validation_split_percentage="0", eval_strategy="no")
    assert list(load_raw(only.data, only.training).splits["train"]["text"]) == LINES[:4]
    assert "skipped 1 of 5 rows" in capsys.readouterr().err
    clean = raw_of(
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
        raw_of(config_for(jsonl(tmp_path, "nulls.jsonl", texts)))
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
    raw = raw_of(config_for("someone/corpus"))
    assert list(raw.splits["train"]["text"]) == LINES[:4] and list(raw.splits["validation"]["text"]) == LINES[4:6]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [
        "mlm-trainer: warning: MLM_DATASET='someone/corpus' (train split): skipped 1 of 5 rows whose 'text' is null "
        "or not a string"
    ]
    assert raw_of(config_for("someone/corpus")).fingerprint == raw.fingerprint  # the same splits, the same name


def test_a_corpus_too_small_to_hold_out_evaluation_data_is_a_config_error(tmp_path):
    corpus = tmp_path / "one.txt"
    corpus.write_text("one long line of text that is the whole corpus\n")
    config = load_config(["--dataset", str(corpus), "--output_dir", str(tmp_path / "out")], {})
    with pytest.raises(ConfigError, match=r"validation_split_percentage=20: holds out no example of the 1 training"):
        load_raw(config.data, config.training)
    quiet = load_config(["--dataset", str(corpus), "--output_dir", str(tmp_path / "o"), "--eval_strategy", "no"], {})
    assert "validation" not in load_raw(quiet.data, quiet.training).splits


def test_a_file_that_is_not_utf8_names_its_line(tmp_path):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes("first line\nsecond line\ncaf\xe9 au lait\n".encode("latin-1"))
    config = load_config(["--dataset", str(corpus), "--output_dir", str(tmp_path / "out")], {})
    with pytest.raises(ConfigError, match=r"not UTF-8 \(line 3\); expected UTF-8 text"):
        load_raw(config.data, config.training)
