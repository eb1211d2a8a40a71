"""Which checkpoint a run resumes from: judged by content, damaged ones skipped with a warning naming both,
never zero resumable checkpoints after rotation, moved-aside ones bounded."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath

import pytest
import torch

from tests.helpers import Payload, checkpoint, flip, truncate
from train.common.errors import ConfigError
from train.config import load_config
from train.config.model_source import SHARDED_WEIGHTS
from train.outputs.checkpoints import (
    decide_resume,
    kept_global_batch,
    problem,
    resume_choice,
    resumed_options,
    surplus_asides,
)
from train.outputs.marker import mark_complete, writer_of
from train.outputs.runfiles import ASIDE_PREFIX, COMPLETE_MARKER, OPTIONS_NAME, RunFiles


def config(tmp_path: Path, **env: str):
    return load_config([], {"MLM_OUTPUT_DIR": str(tmp_path), **{f"MLM_{k.upper()}": v for k, v in env.items()}})


def resumed(config) -> dict:
    """The options a checkpoint of ``config``'s run records (as train/outputs/location.py hands them over)."""
    return resumed_options(config.as_dict(), config.training.world_size)


def kept(config, checkpoint: Path) -> tuple[int | None, str] | None:
    """kept_global_batch with what it reads of ``config``: the Trainer's batch options and where options were set."""
    return kept_global_batch(config.training, config.sources, checkpoint)


def decide(config, files: RunFiles, warn) -> str | None:
    """decide_resume as a directory's choose_resume calls it, with ``config``'s checkpoint section and options."""
    return decide_resume(config.checkpoint, files, resumed(config), warn)


def test_a_whole_checkpoint_is_resumable(tmp_path):
    assert problem(checkpoint(tmp_path, 10)) is None


def test_weights_in_shards_are_model_weights(tmp_path):
    sharded = checkpoint(tmp_path, 10, marked=False)  # as MLM_SHARDING=fsdp writes it: each rank's shard
    (sharded / "model.safetensors").unlink()
    (sharded / SHARDED_WEIGHTS).mkdir()
    (sharded / SHARDED_WEIGHTS / "__0_0.distcp").write_bytes(b"shard")
    mark_complete(sharded)
    assert problem(sharded) is None
    (sharded / SHARDED_WEIGHTS / "__0_0.distcp").write_bytes(b"shart")  # a shard as damaged as a whole file
    assert "__0_0.distcp" in (problem(sharded) or "")


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda c: truncate(c / "model.safetensors"), "model.safetensors: truncated"),
        (lambda c: truncate(c / "optimizer.pt"), "optimizer.pt: "),
        (lambda c: truncate(c / "rng_state.pth", 0.9), "rng_state.pth: "),
        (lambda c: (c / "trainer_state.json").write_text('{"global_step": 1'), "trainer_state.json does not parse"),
        (lambda c: (c / "trainer_state.json").write_text('{"global_step": 5}'), "does not hold step 10"),
        (lambda c: (c / "trainer_state.json").unlink(), "cut off while being written"),
        (lambda c: (c / "model.safetensors").unlink(), "no model weights"),
        (lambda c: (c / "config.json").write_text("{"), "config.json does not parse"),
    ],
)
def test_damage_is_found(tmp_path, damage, reason):
    path = checkpoint(tmp_path, 10)
    damage(path)
    assert reason in (problem(path) or "")


def test_a_damaged_newest_checkpoint_falls_back_to_the_older_one(tmp_path):
    checkpoint(tmp_path, 10)
    newest = checkpoint(tmp_path, 20)
    truncate(newest / "model.safetensors")  # marked complete, then damaged: a full disk, another writer
    warnings: list[str] = []
    assert decide(config(tmp_path), RunFiles(tmp_path), warnings.append) == str(tmp_path / "checkpoint-10")
    assert len(warnings) == 1
    assert warnings[0].startswith("cannot resume from checkpoint-20 (model.safetensors: truncated")
    assert "resuming from checkpoint-10 instead" in warnings[0]
    assert not newest.exists() and len(list(tmp_path.glob(f"{ASIDE_PREFIX}checkpoint-20-*"))) == 1
    # the next start finds the same answer without a warning
    assert decide(config(tmp_path), RunFiles(tmp_path), warnings.append) == str(tmp_path / "checkpoint-10")
    assert len(warnings) == 1


def test_an_unmarked_but_whole_checkpoint_is_resumed(tmp_path):
    """The Trainer rotates the older checkpoint away before on_save marks the new one: a kill in between must
    still leave the new one resumable."""
    checkpoint(tmp_path, 20, marked=False)
    chosen, skipped = resume_choice(config(tmp_path).checkpoint, RunFiles(tmp_path))
    assert chosen == tmp_path / "checkpoint-20" and skipped == []
    assert not (chosen / COMPLETE_MARKER).exists()


def test_nothing_resumable_starts_over_and_says_so(tmp_path):
    (tmp_path / "checkpoint-5").mkdir()
    warnings: list[str] = []
    assert decide(config(tmp_path), RunFiles(tmp_path), warnings.append) is None
    assert "no resumable checkpoint left: starting over" in warnings[0]
    assert decide(config(tmp_path, resume="never"), RunFiles(tmp_path), warnings.append) is None


def test_explicit_resume_path_must_be_a_resumable_checkpoint(tmp_path):
    with pytest.raises(ConfigError, match=r"MLM_RESUME='.*nowhere': not a checkpoint directory"):
        resume_choice(config(tmp_path, resume=str(tmp_path / "nowhere")).checkpoint, RunFiles(tmp_path))
    damaged = checkpoint(tmp_path, 30)
    truncate(damaged / "optimizer.pt")
    with pytest.raises(ConfigError, match=r"MLM_RESUME='.*checkpoint-30': optimizer.pt: "):
        resume_choice(config(tmp_path, resume=str(damaged)).checkpoint, RunFiles(tmp_path))
    assert (
        resume_choice(config(tmp_path, resume=str(checkpoint(tmp_path, 40))).checkpoint, RunFiles(tmp_path))[0]
        == tmp_path / "checkpoint-40"
    )


def test_moved_aside_checkpoints_are_bounded_by_step_in_a_directory_and_a_store_alike():
    names = [f"{ASIDE_PREFIX}checkpoint-{n}-{pid}" for n, pid in ((9, 1), (30, 7), (12, 3), (100, 2), (4, 5))]
    assert surplus_asides(names, keep=2) == [f"{ASIDE_PREFIX}checkpoint-{n}" for n in ("12-3", "9-1", "4-5")]


def test_resuming_with_changed_options_names_what_is_kept_and_what_reorders(tmp_path):
    old = config(tmp_path, learning_rate="5e-4", per_device_train_batch_size="16")
    path = checkpoint(tmp_path, 10, marked=False)
    mark_complete(path, resumed(old))
    warnings: list[str] = []
    decide(config(tmp_path, learning_rate="1e-5", per_device_train_batch_size="8"), RunFiles(tmp_path), warnings.append)
    assert len(warnings) == 2
    assert "learning_rate 1e-05 (checkpoint: 0.0005)" in warnings[0] and "keeps the checkpoint's values" in warnings[0]
    assert "per_device_train_batch_size 8 (checkpoint: 16)" in warnings[1] and "data order" in warnings[1]
    warnings.clear()
    decide(old, RunFiles(tmp_path), warnings.append)
    assert warnings == []
    # a branch's first start honours its new learning rate: only the reordering is said
    new = config(tmp_path, learning_rate="1e-5", per_device_train_batch_size="8")
    decide_resume(new.checkpoint, RunFiles(tmp_path), resumed(new), warnings.append, lambda chosen: ["learning_rate"])
    assert len(warnings) == 1 and "data order" in warnings[0]


# ---- the marker's list of files: sizes and SHA-256, and the safe load ------------------------------------------


def test_the_marker_lists_every_file_with_its_size_and_digest(tmp_path):
    path = checkpoint(tmp_path, 10)
    listed = json.loads((path / COMPLETE_MARKER).read_text())["files"]
    assert sorted(listed) == sorted(p.name for p in path.iterdir() if p.name != COMPLETE_MARKER)
    weights = path / "model.safetensors"
    assert listed["model.safetensors"] == {
        "size": weights.stat().st_size,
        "sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
    }


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"])
def test_a_flipped_bit_in_any_file_is_named(tmp_path, name):
    path = checkpoint(tmp_path, 10)
    flip(path / name)
    assert problem(path) == f"{name}: its SHA-256 differs from the marker's (the bytes changed after it was written)"


def test_a_missing_an_extra_or_a_resized_file_is_named(tmp_path):
    path = checkpoint(tmp_path, 10)
    (path / "scheduler.pt").unlink()
    assert problem(path) == "scheduler.pt: missing (the marker lists it)"
    other = checkpoint(tmp_path, 20)
    (other / "notes.txt").write_text("left by a second writer")
    assert problem(other) == "notes.txt: not among the files the marker lists"
    resized = checkpoint(tmp_path, 30)
    (resized / "config.json").write_text('{"model_type": "bert"}')
    assert (problem(resized) or "").startswith("config.json: 22 bytes, the marker says 2")


# Every file of a checkpoint the Trainer unpickles on resume (one per kind: the optimizer, the scheduler, the AMP
# scaler, each rank's RNG state, weights saved as a pickle); training_args.bin it never reads (the e2e resume in
# tests/e2e/test_reliability.py plants one there and resumes from it).
UNPICKLED = ["optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state.pth", "rng_state_1.pth", "pytorch_model.bin"]


@pytest.mark.parametrize("name", UNPICKLED)
def test_a_planted_pickle_never_runs_even_with_a_marker_that_lists_it(tmp_path, name):
    """The writer of a shared volume can rewrite the marker too: the safe load refuses the pickle, nothing runs,
    and the resume takes the older checkpoint."""
    ran = tmp_path / "ran"
    checkpoint(tmp_path, 10)
    path = checkpoint(tmp_path, 20)
    torch.save({"state": Payload(ran)}, path / name)
    mark_complete(path)  # the digests agree with the planted file
    assert (problem(path) or "").startswith(f"{name}: fails the safe load")
    warnings: list[str] = []
    assert decide(config(tmp_path), RunFiles(tmp_path), warnings.append) == str(tmp_path / "checkpoint-10")
    assert warnings[0].startswith(f"cannot resume from checkpoint-20 ({name}: fails the safe load")
    assert not ran.exists()


def test_the_pickle_no_resume_reads_is_left_unread(tmp_path):
    ran = tmp_path / "ran"
    path = checkpoint(tmp_path, 10)
    torch.save(Payload(ran), path / "training_args.bin")
    mark_complete(path)
    assert problem(path) is None and not ran.exists()


def test_a_damaged_checkpoint_is_set_aside_with_one_line_and_the_older_one_used(tmp_path):
    checkpoint(tmp_path, 10)
    newest = checkpoint(tmp_path, 20)
    flip(newest / "optimizer.pt")
    warnings: list[str] = []
    assert decide(config(tmp_path), RunFiles(tmp_path), warnings.append) == str(tmp_path / "checkpoint-10")
    assert warnings[0].startswith("cannot resume from checkpoint-20 (optimizer.pt: its SHA-256 differs")
    assert "resuming from checkpoint-10 instead" in warnings[0]


def test_a_checkpoint_marked_before_markers_listed_files_is_judged_by_content(tmp_path):
    path = checkpoint(tmp_path, 10)
    (path / COMPLETE_MARKER).write_text("2026-11-01T10:00:00\n")  # an earlier version's marker: a time only
    assert problem(path) is None


# ---- a resume on another world size keeps the checkpoint's global batch ---------------------------------------


def trained_on(tmp_path: Path, ranks: int, per_device: int, accumulation: int = 1) -> Path:
    path = checkpoint(tmp_path, 10)
    options = {
        "world_size": ranks,
        "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": accumulation,
    }
    (path / OPTIONS_NAME).write_text(json.dumps(options))
    return path


def test_one_rank_resuming_two_keeps_their_global_batch_by_accumulating(tmp_path):
    path = trained_on(tmp_path, ranks=2, per_device=16)
    accumulation, line = kept(config(tmp_path, per_device_train_batch_size="16"), path) or (0, "")
    assert accumulation == 2
    assert line == (
        "resuming checkpoint-10 (global batch 32 = 2 rank(s) x 16 per device x 1 accumulation step(s)) on 1 rank(s): "
        "keeping its global batch, 1 rank(s) x 16 per device x 2 accumulation step(s); MLM_GLOBAL_BATCH_SIZE sets another"
    )


def test_a_batch_that_cannot_be_kept_is_said_and_one_chosen_this_run_wins(tmp_path):
    path = trained_on(tmp_path, ranks=3, per_device=16)  # 48 samples a step; 32 per device here
    accumulation, line = kept(config(tmp_path, per_device_train_batch_size="32"), path) or (0, "")
    assert accumulation is None and "48 is no multiple of 32, so the global batch becomes 32" in line
    for chosen in ({"global_batch_size": "64"}, {"gradient_accumulation_steps": "1"}):
        assert kept(config(tmp_path, per_device_train_batch_size="16", **chosen), path) is None
    same = trained_on(tmp_path / "same", ranks=1, per_device=8, accumulation=2)
    assert kept(config(tmp_path, per_device_train_batch_size="8", gradient_accumulation_steps="2"), same) is None
    assert kept(config(tmp_path, per_device_train_batch_size="16"), same) is None  # 16 either way


def test_each_rank_wrote_its_own_sharded_optimizer_file() -> None:
    assert writer_of(PurePosixPath("optimizer_dcp/__1_0.distcp")) == 1
    assert writer_of(PurePosixPath("optimizer_dcp/__0_0.distcp")) == 0
    assert writer_of(PurePosixPath("optimizer_dcp/.metadata.pt")) == 0  # the coordinator's
    assert writer_of(PurePosixPath("rng_state_3.pth")) == 3


def rewritten_marker(path: Path, change: dict) -> None:
    marker = json.loads((path / COMPLETE_MARKER).read_text())
    marker["files"].update(change)
    (path / COMPLETE_MARKER).write_text(json.dumps(marker))


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"world_size": 0}, "mlm_options.json: world_size 0 is not a whole number of at least 1"),
        ({"per_device_train_batch_size": "16"}, "per_device_train_batch_size '16' is not a whole number"),
        ({"gradient_accumulation_steps": True}, "gradient_accumulation_steps True is not a whole number"),
        ({"data_identity": {"corpus.txt": 12}}, "data_identity is not a mapping of the data's files"),
        ([1, 2], "mlm_options.json: not a mapping of options"),
    ],
)
def test_a_checkpoints_records_of_the_wrong_shape_make_it_damaged(tmp_path, options, reason):
    """A resume acts on the options a checkpoint records (the batch it keeps, the data it compares) and on its
    marker's list: read back as data, one of the wrong type or range sets the checkpoint aside like damage."""
    path = checkpoint(tmp_path, 10, marked=False)
    saved = {"world_size": 1, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}
    (path / OPTIONS_NAME).write_text(json.dumps({**saved, **options} if isinstance(options, dict) else options))
    mark_complete(path)
    assert problem(path) == reason if reason.startswith("mlm_options.json") else reason in (problem(path) or "")


def test_a_marker_entry_of_the_wrong_shape_is_named(tmp_path):
    path = checkpoint(tmp_path, 10)
    rewritten_marker(path, {"config.json": 2})
    assert problem(path) == f"{COMPLETE_MARKER}: config.json: 2 is not a size and a SHA-256"
    other = checkpoint(tmp_path, 20)
    rewritten_marker(other, {"config.json": {"size": -1, "sha256": "00"}})
    assert "config.json: {'size': -1, 'sha256': '00'} is not a size and a SHA-256" in (problem(other) or "")
