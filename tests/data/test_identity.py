"""train/data/identity.py: what a checkpoint and run.json record of the data, and what counts as a change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import demo_config
from train.data import identity
from train.data.identity import changes, data_identity, files_identity

LINES = "".join(f"line {i} of a corpus\n" for i in range(200))


def test_a_file_is_known_by_its_size_and_content_not_its_path_or_time(tmp_path: Path) -> None:
    corpus = tmp_path / "a" / "corpus.txt"
    corpus.parent.mkdir()
    corpus.write_text(LINES)
    before = data_identity(demo_config(dataset=str(corpus)).data, "fp")
    assert list(before) == ["corpus.txt"] and before["corpus.txt"]["size"] == len(LINES)
    copied = tmp_path / "b" / "corpus.txt"  # on a fresh machine: another folder, a new modification time
    copied.parent.mkdir()
    copied.write_text(LINES)
    os.utime(copied, (1e9, 1e9))
    assert changes(before, data_identity(demo_config(dataset=str(copied)).data, "fp")) == ([], [])
    corpus.write_text(LINES.replace("line 7 ", "line 8 "))  # replaced in place, same size
    changed, _ = changes(before, data_identity(demo_config(dataset=str(corpus)).data, "fp"))
    assert len(changed) == 1 and changed[0].startswith("corpus.txt: 4,090 bytes, modified")
    assert "(recorded: 4,090 bytes" in changed[0]


def test_files_added_gone_or_in_the_validation_file_are_named(tmp_path: Path) -> None:
    folder = tmp_path / "shards"
    folder.mkdir()
    for name in ("a.txt", "b.txt"):
        (folder / name).write_text(LINES)
    held_out = tmp_path / "held_out.txt"
    held_out.write_text(LINES)
    config = demo_config(dataset=str(folder), validation_file=str(held_out))
    before = data_identity(config.data, "fp")
    assert sorted(before) == ["a.txt", "b.txt", "validation:held_out.txt"]
    (folder / "b.txt").unlink()
    (folder / "c.txt").write_text(LINES)
    held_out.write_text(LINES + "one more\n")
    changed, _ = changes(before, data_identity(config.data, "fp"))
    assert changed[:2] == ["b.txt gone", "c.txt added"] and changed[2].startswith(
        "validation:held_out.txt: 4,099 bytes"
    )
    assert changes(None, before) == ([], [])  # a record without it: nothing to compare


def test_a_large_corpus_is_sampled_and_a_new_time_alone_is_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(identity, "WHOLE_DIGEST_BYTES", 1000)
    monkeypatch.setattr(identity, "SAMPLE_BYTES", 100)
    corpus = tmp_path / "big.txt"
    corpus.write_text(LINES)
    before = files_identity([str(corpus)])
    assert before["big.txt"]["sampled"] is True
    corpus.write_text(LINES.replace("line 57 ", "line 75 "))  # between the samples: same digest
    os.utime(corpus, (2e9, 2e9))
    changed, notes = changes(before, files_identity([str(corpus)]))
    assert changed == [] and notes == [
        "big.txt was modified since (2033-05-18T03:33:20+00:00; its sampled content is the same)"
    ]


def test_the_demo_and_a_hub_dataset_are_known_by_their_size_and_fingerprint() -> None:
    assert data_identity(demo_config(demo_samples="400").data, "demo-400") == {"demo": {"samples": 400}}
    assert changes({"demo": {"samples": 400}}, {"demo": {"samples": 800}})[0] == [
        "demo: samples 800 (recorded: samples 400)"
    ]
