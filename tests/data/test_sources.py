"""train.data.sources: what a dataset name is (demo, files, save_to_disk, hub), the one suffix list, and the
one-line errors for a source that is not there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.data.helpers import bad, config_for, raw_of, write_compressed, write_formats, write_shards
from train.common import hf
from train.common.errors import ConfigError
from train.data.sources import data_format, is_remote, resolve, resolve_files, shown_url, source_files
from train.launch.hub import hub_repositories


def test_format_looks_through_one_compression_suffix() -> None:
    assert data_format("a/b/corpus.jsonl.zst") == "json"
    assert data_format("corpus.v2.TXT.GZ") == "text"
    assert data_format("x.parquet") == "parquet"
    assert data_format("x.gz") is None and data_format("x.docx") is None


def test_urls() -> None:
    assert shown_url("https://user:secret@host/data.txt") == "https://host/data.txt"
    assert is_remote("s3://bucket/x.txt") and is_remote("HF://datasets/x") and not is_remote("file:///data/x.txt")
    assert not is_remote("org/dataset") and not is_remote("./x.txt")


def test_each_kind_of_source(tmp_path: Path) -> None:
    paths = write_formats(tmp_path)
    assert resolve("demo", "MLM_DATASET").kind == "demo"
    hub = resolve("org/corpus", "MLM_DATASET", "wikitext-2")
    assert (hub.kind, hub.config_name) == ("hub", "wikitext-2")
    saved = resolve(str(paths["save_to_disk"]), "MLM_DATASET")
    assert saved.kind == "saved" and not saved.files  # datasets reads it; its .json metadata is not a corpus
    files = resolve(str(paths["directory"]), "MLM_DATASET")
    assert (files.kind, files.builder) == ("files", "text")
    assert [Path(f).name for f in files.files] == ["a.txt", "b.txt"]
    with pytest.raises(ConfigError, match="no such file"):
        resolve_files("demo", "MLM_VALIDATION_FILE")  # a validation file is never the demo or a hub id


@pytest.mark.parametrize("name", ["corpus.jsonl.zst", "corpus.txt.gz", "corpus.csv.bz2", "corpus.json.xz"])
@pytest.mark.parametrize("streaming", [False, True])
def test_a_missing_relative_compressed_file_is_no_such_file_not_a_hub_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, streaming: bool
) -> None:
    monkeypatch.chdir(tmp_path)
    assert hf.looks_local(name)
    options = {"streaming": "true", "max_steps": "3", "max_eval_samples": "2"} if streaming else {}
    with pytest.raises(ConfigError, match=rf"^MLM_DATASET='{name}': no such file or directory$") as info:
        raw_of(config_for(name, **options))
    assert info.value.exit_code == 2


def test_the_suffixes_are_one_list() -> None:
    """hf.looks_local and the readers agree: every suffix a reader accepts makes a name local."""
    assert set(hf.LOCAL_SUFFIXES) == set(hf.BUILDERS) | set(hf.COMPRESSIONS)
    for suffix in hf.BUILDERS:
        assert data_format(f"x{suffix}") and hf.looks_local(f"x{suffix}")
        for compression in hf.COMPRESSIONS:
            assert data_format(f"x{suffix}{compression}") and hf.looks_local(f"x{suffix}{compression}")


@pytest.mark.parametrize(
    ("name", "hub"),
    [("demo", False), ("wikitext", True), ("org/corpus", True), ("./corpus", False), ("corpus.jsonl", False),
     ("s3://bucket/corpus", False), ("hf://datasets/org/corpus", False), ("file:///data/dir", False)],
)  # fmt: skip
def test_what_a_dataset_name_is_decided_by_one_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, hub: bool
) -> None:
    """The resolver (what the job reads), the launcher's hub check, doctor and the model card all ask
    hf.is_hub_dataset: a name is a hub id for each of them or for none."""
    monkeypatch.chdir(tmp_path)
    assert hf.is_hub_dataset(name) is hub
    config = config_for(name)
    assert (("MLM_DATASET", name, "dataset") in hub_repositories(config.model, config.data)) is hub
    if hub:
        assert resolve(name, "MLM_DATASET").kind == "hub"


def test_a_glob_and_a_directory_list_only_data_files(tmp_path: Path) -> None:
    write_shards(tmp_path / "corpus", shards=3, per_shard=2)
    (tmp_path / "corpus" / "README.md").write_text("not data")  # a directory's other files are not the corpus
    for source in (tmp_path / "corpus", tmp_path / "corpus" / "part-*.jsonl.gz"):
        builder, files = source_files(str(source), "MLM_DATASET")
        assert builder == "json" and [Path(f).name for f in files] == [f"part-{i}.jsonl.gz" for i in range(3)]
    with pytest.raises(ConfigError, match=r"MLM_DATASET=.*nothing-\*\.txt.*matches no file"):
        source_files(str(tmp_path / "nothing-*.txt"), "MLM_DATASET")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: str(p / "nope.txt"), r"MLM_DATASET='.*nope.txt': no such file or directory"),
        (lambda p: bad(p, "empty.txt", b""), r"MLM_DATASET='.*empty.txt': the file is empty"),
        (lambda p: bad(p, "data.xml", b"<a/>"), r"unsupported extension '.xml'"),
        (lambda p: str(p), r"no \.txt/\.jsonl/\.json/\.csv/\.parquet files \(also \.gz/\.bz2/\.xz/\.zst\) there"),
    ],
)
def test_a_source_that_is_not_there_is_one_clear_line(tmp_path: Path, make, message: str) -> None:
    name = make(tmp_path)
    with pytest.raises(ConfigError, match=message) as info:
        source_files(name, "MLM_DATASET")
    assert "\n" not in str(info.value)


def test_mixed_formats_are_refused(tmp_path: Path) -> None:
    paths = write_compressed(tmp_path)
    assert len(paths) > 1
    with pytest.raises(ConfigError, match="files of several formats"):
        source_files(str(tmp_path), "MLM_DATASET")


def test_a_path_longer_than_the_filesystem_allows_is_a_config_error(tmp_path: Path) -> None:
    too_long = str(tmp_path / ("a" * 300 + ".txt"))
    with pytest.raises(ConfigError, match=r"^MLM_DATASET='.*: File name too long; expected a readable file"):
        resolve(too_long, "MLM_DATASET")
