"""output_dir and the HF cache: writable through probe_write, free space, a finished final/ (the job's refusal),
and the checkpoint a run would resume from, as the output location the job holds says."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.doctor.helpers import checks
from tests.fakes import no_driver
from train.doctor import storage


def resumable(checkpoint: Path) -> Path:
    """A checkpoint train.outputs.checkpoints accepts: trainer_state.json naming its step and whole weights."""
    checkpoint.mkdir(parents=True)
    step = int(checkpoint.name.rsplit("-", 1)[1])
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (checkpoint / "model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")  # an empty, whole file
    return checkpoint


def test_output_under_a_file_fails(env, tmp_path, monkeypatch):
    no_driver(monkeypatch)
    (tmp_path / "plain-file").write_text("x")
    monkeypatch.setenv("MLM_OUTPUT_DIR", str(tmp_path / "plain-file" / "out"))
    found = checks()["output_dir"]
    assert found.status == "FAIL" and "is not a directory" in found.detail and "MLM_OUTPUT_DIR" in found.fix


def test_unwritable_output_fails(env, tmp_path, monkeypatch):
    no_driver(monkeypatch)
    (tmp_path / "out").mkdir()

    def denied(directory):
        raise PermissionError(13, "Permission denied")

    # root ignores file modes, so the refusal is simulated at the one call that tests writing
    monkeypatch.setattr(storage, "probe_write", denied)
    found = checks()
    assert found["output_dir"].status == "FAIL" and "not writable (Permission denied)" in found["output_dir"].detail
    assert found["cache (HF_HOME)"].status == "FAIL"


def test_a_full_disk_is_named(env, tmp_path, monkeypatch):
    def full(directory):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(storage, "probe_write", full)
    found = storage.check_writable("output_dir", tmp_path / "new" / "out", "fix")
    assert found.status == "FAIL" and "no space left on the device" in found.detail
    assert f"its nearest existing parent {tmp_path}" in found.detail


def test_probing_leaves_nothing_behind(tmp_path):
    assert storage.check_writable("output_dir", tmp_path / "out", "fix").status in ("OK", "WARN")
    assert list(tmp_path.iterdir()) == []


def test_output_holding_a_finished_model_fails_and_checkpoints_are_noted(env, tmp_path, monkeypatch):
    no_driver(monkeypatch)
    resumable(tmp_path / "out" / "checkpoint-40")
    (tmp_path / "out" / "checkpoint-60").mkdir()  # cut off: no trainer_state.json
    found = checks()["output_dir"]
    assert found.status == "OK" and "a run would resume from checkpoint-40" in found.detail
    assert "checkpoint-60 (no trainer_state.json" in found.detail
    assert (tmp_path / "out" / "checkpoint-60").is_dir()  # doctor only looks
    (tmp_path / "out" / "final").mkdir()
    found = checks()["output_dir"]
    assert found.status == "FAIL" and "MLM_OVERWRITE_OUTPUT_DIR=true" in found.detail
    monkeypatch.setenv("MLM_OVERWRITE_OUTPUT_DIR", "true")
    assert checks()["output_dir"].status == "OK"


def test_a_link_inside_the_output_directory_fails_as_the_job_would_refuse_it(env, tmp_path, monkeypatch):
    no_driver(monkeypatch)
    (tmp_path / "out" / "logs").mkdir(parents=True)
    (tmp_path / "out" / "logs" / "train.jsonl").symlink_to(tmp_path / "elsewhere.txt")
    found = checks()["output_dir"]
    assert found.status == "FAIL" and "the job would refuse to start" in found.detail
    assert "logs/train.jsonl (to " in found.detail and "is a symbolic link inside it" in found.detail


def test_an_explicit_resume_path_that_is_no_checkpoint_fails(env, tmp_path, monkeypatch):
    no_driver(monkeypatch)
    monkeypatch.setenv("MLM_RESUME", str(tmp_path / "nowhere"))
    found = checks()["output_dir"]
    assert found.status == "FAIL" and "MLM_RESUME" in found.detail and "not a checkpoint directory" in found.detail


@pytest.mark.parametrize(("free_gib", "status"), [(0.5, "FAIL"), (5, "WARN"), (50, "OK")])
def test_free_space(tmp_path, monkeypatch, free_gib, status):
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda p: SimpleNamespace(free=int(free_gib * 1024**3)))
    assert storage.check_writable("output_dir", tmp_path, "fix").status == status


def test_cache_row_follows_hf_home(tmp_path):
    found = storage.check_cache({"HF_HOME": str(tmp_path / "cache")})
    assert found.name == "cache (HF_HOME)" and str(tmp_path / "cache") in found.detail
    xdg = storage.check_cache({"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert str(tmp_path / "xdg" / "huggingface") in xdg.detail
