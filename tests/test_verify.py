"""``./entrypoint.sh verify``: a final model or a checkpoint checked against the digests its marker lists, locally
and in a bucket (moto's S3 server on loopback); a flipped byte is named, exit 2."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers import checkpoint, flip, flipped
from train.common.errors import EXIT_CONFIG, ConfigError, run_main
from train.outputs.local import publish_final
from train.outputs.runfiles import COMPLETE_MARKER, RunFiles
from train.outputs.store import NAMES, Store
from train.outputs.verify import main, verify


def write_model(directory: Path) -> None:
    (directory / "config.json").write_text('{"model_type": "bert"}')
    (directory / "model.safetensors").write_bytes(b"\x10" * 4096)
    (directory / "tokenizer.json").write_text("{}")


def test_a_published_final_lists_its_files_and_verifies(tmp_path: Path) -> None:
    final = publish_final(RunFiles(tmp_path), write_model)
    assert (final / COMPLETE_MARKER).is_file()
    assert verify(final, "final").startswith("final: intact: 3 file(s)")
    (final / "README.md").write_text("the card, written after the list")  # allowed: it names the weights' digest
    assert "intact" in verify(final, "final")
    flip(final / "model.safetensors", 100)
    with pytest.raises(ConfigError, match=r"^final: model.safetensors: its SHA-256 differs"):
        verify(final, "final")


def test_an_extra_file_a_checkpoint_and_a_directory_without_a_list(tmp_path: Path) -> None:
    final = publish_final(RunFiles(tmp_path / "a"), write_model)
    (final / "extra.bin").write_bytes(b"\0")
    with pytest.raises(ConfigError, match=r"extra.bin: not among the files the marker lists"):
        verify(final, "final")
    assert "intact" in verify(checkpoint(tmp_path / "b", 10), "checkpoint-10")
    (tmp_path / "c").mkdir()
    with pytest.raises(ConfigError, match=r"holds no list of its files"):
        verify(tmp_path / "c", "c")
    assert run_main(main, [str(tmp_path / "nowhere")]) == EXIT_CONFIG


def test_the_command_verifies_a_final_model_in_a_bucket(aws, bucket, tmp_path: Path) -> None:
    final = publish_final(RunFiles(tmp_path), write_model)
    store = Store(f"s3://{bucket}/run")
    store.publish_final(final)
    url = f"s3://{bucket}/run/final"
    assert run_main(main, [url]) == 0
    data = flipped((final / "model.safetensors").read_bytes(), 7)
    store.pipe(NAMES.final / "model.safetensors", data)  # one bit, in the bucket's copy only
    assert run_main(main, [url]) == EXIT_CONFIG


def test_entrypoint_dispatches_verify(tmp_path: Path) -> None:
    final = publish_final(RunFiles(tmp_path), write_model)
    flip(final / "model.safetensors", 100)
    done = subprocess.run([str(REPO / "entrypoint.sh"), "verify", str(final)], capture_output=True, text=True)
    assert done.returncode == EXIT_CONFIG and "model.safetensors: its SHA-256 differs" in done.stderr
