"""Outputs in a directory lose nothing: atomic final/, refusal to overwrite, writability checks, starting over."""

from __future__ import annotations

import errno
import shutil
import subprocess
from pathlib import Path

import pytest

from train.common.errors import EXIT_CONFIG, EXIT_ENVIRONMENT, ConfigError, EnvironmentProblem
from train.common.writable import LOW_SPACE_BYTES, disk_full
from train.config import load_config
from train.outputs.checkpoints import decide_resume, resumed_options
from train.outputs.local import publish_final
from train.outputs.location import output_location
from train.outputs.runfiles import CUT_SHORT, RunFiles


def config(tmp_path: Path, **env: str):
    return load_config([], {"MLM_OUTPUT_DIR": str(tmp_path), **{f"MLM_{k.upper()}": v for k, v in env.items()}})


def test_final_appears_whole_or_not_at_all(tmp_path: Path) -> None:
    def crash(directory: Path) -> None:
        (directory / "model.safetensors").write_text("half")
        raise OSError("disk went away")

    with pytest.raises(OSError):
        publish_final(RunFiles(tmp_path), crash)
    assert not (tmp_path / "final").exists()

    publish_final(RunFiles(tmp_path), lambda d: (d / "model.safetensors").write_text("v1"))
    with pytest.raises(OSError):
        publish_final(RunFiles(tmp_path), crash)
    assert (tmp_path / "final" / "model.safetensors").read_text() == "v1"  # the earlier model is intact

    publish_final(RunFiles(tmp_path), lambda d: (d / "model.safetensors").write_text("v2"))
    assert (tmp_path / "final" / "model.safetensors").read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_finished_final_is_kept_unless_overwrite(tmp_path: Path) -> None:
    (tmp_path / "final").mkdir()
    with pytest.raises(
        ConfigError, match=r"holds a finished model in final/; set MLM_OVERWRITE_OUTPUT_DIR=true"
    ) as info:
        output_location(config(tmp_path)).check()
    assert info.value.exit_code == EXIT_CONFIG
    output_location(config(tmp_path, overwrite_output_dir="true")).check()
    output_location(config(tmp_path)).check(dry_run=True)  # plan reports it instead
    assert output_location(config(tmp_path)).facts()["a run would"].startswith("refuse")


def test_a_stopped_runs_final_is_no_finished_model_and_the_next_run_replaces_it(tmp_path: Path) -> None:
    # A budgeted run stopped by a signal publishes its decayed model marked (train/run/budget.py): rerunning resumes.
    publish_final(RunFiles(tmp_path), lambda d: (d / CUT_SHORT).write_text("{}"))
    location = output_location(config(tmp_path))
    location.check()
    assert not location.has_final() and location.facts()["finished_model"] is False
    publish_final(RunFiles(tmp_path), lambda d: (d / "model.safetensors").write_text("finished"))
    assert location.has_final() and not (tmp_path / "final" / CUT_SHORT).exists()


def test_output_dir_that_cannot_be_created_is_an_environment_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(EnvironmentProblem, match=r"MLM_OUTPUT_DIR='.*file/out': not writable") as info:
        output_location(config(blocker / "out")).check()
    assert info.value.exit_code == EXIT_ENVIRONMENT


def test_full_output_device_is_reported(tmp_path: Path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root and mount rights)")
    try:
        subprocess.run(["dd", "if=/dev/zero", f"of={mount / 'filler'}", "bs=4k"], capture_output=True)  # fills it
        with pytest.raises(EnvironmentProblem, match=r"not writable \(no space left on the device\)"):
            output_location(config(mount / "out")).check()
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_overwrite_starts_a_finished_run_over_and_a_restart_then_resumes(tmp_path: Path) -> None:
    PREVIOUS = RunFiles(tmp_path).final_previous.name

    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "model.safetensors").write_text("old model")
    (tmp_path / "checkpoint-80").mkdir()
    warnings: list[str] = []
    overwrite = config(tmp_path, overwrite_output_dir="true")
    assert output_location(overwrite).start_over(warnings.append)
    assert "starting over" in warnings[0] and "1 checkpoint(s) were removed" in warnings[0]
    assert not (tmp_path / "final").exists() and not (tmp_path / "checkpoint-80").exists()
    assert (tmp_path / PREVIOUS / "model.safetensors").read_text() == "old model"  # kept until replaced
    resumed = resumed_options(overwrite.as_dict(), overwrite.training.world_size)
    assert decide_resume(overwrite.checkpoint, RunFiles(tmp_path), resumed, warnings.append) is None  # step 0
    # preempted, restarted with the same options: no final/ now, so nothing is removed again
    (tmp_path / "checkpoint-10").mkdir()
    assert not output_location(overwrite).start_over(warnings.append) and (tmp_path / "checkpoint-10").exists()
    publish_final(RunFiles(tmp_path), lambda d: (d / "model.safetensors").write_text("new model"))
    assert not (tmp_path / PREVIOUS).exists() and (tmp_path / "final" / "model.safetensors").read_text() == "new model"
    assert not output_location(config(tmp_path)).start_over(
        warnings.append
    )  # without the option a finished run is never touched


# ---- disk_full: how a failed write is told apart from a full device ---------------------------------------------


def _raised_from(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as cause:
            raise outer from cause
    except BaseException as caught:
        return caught


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        _raised_from(RuntimeError("saving failed"), OSError(errno.ENOSPC, "nope")),  # the errno in the chain
        RuntimeError("No space left on device (os error 28)"),  # safetensors' Rust error
        RuntimeError("Error while serializing: StorageFull"),
    ],
)
def test_a_full_device_is_recognised_by_errno_or_words(exc: BaseException, tmp_path: Path) -> None:
    assert disk_full(exc, tmp_path)


def test_a_failed_write_counts_as_full_only_when_the_device_is_nearly_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exc = RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 4160 vs 4053")  # torch.save
    assert not disk_full(exc, tmp_path)  # plenty of space here: some other failure
    assert not disk_full(exc, tmp_path / "gone")  # the device cannot be asked: not called full
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=LOW_SPACE_BYTES - 1))
    assert disk_full(exc, tmp_path)
    assert not disk_full(ValueError("shapes do not match"), tmp_path)  # not a write at all
