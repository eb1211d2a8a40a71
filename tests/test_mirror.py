"""An output_dir in a store: the configuration's staging directory, and train/outputs/mirror.py's rules against a real
S3-compatible server (moto's, on loopback): who uploads which file of a checkpoint, what a run would do, starting
over, a cut-off upload uploaded again, staging cleared of earlier runs, the log fetched to be appended to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import checkpoint, flipped
from train.common.errors import ConfigError
from train.common.hf import cache_key, cache_root
from train.config import load_config
from train.outputs.location import output_location
from train.outputs.marker import writer_of
from train.outputs.mirror import Mirror
from train.outputs.runfiles import COMPLETE_MARKER, RunFiles
from train.outputs.store import NAMES


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("rng_state.pth", 0),
        ("rng_state_0.pth", 0),
        ("rng_state_3.pth", 3),
        ("optimizer.pt", 0),
        ("x/rng_state_2.pth", 2),
    ],
)
def test_each_rank_uploads_its_own_rng_state_and_rank_0_the_rest(name: str, rank: int) -> None:
    assert writer_of(Path(name)) == rank


def test_a_store_url_trains_in_a_staging_directory_named_by_the_url(tmp_path: Path) -> None:
    config = load_config([], {"MLM_OUTPUT_DIR": "s3://bucket/runs/a", "HF_HOME": str(tmp_path)})
    assert config.output_store == "s3://bucket/runs/a" and config.output_store_source == "MLM_OUTPUT_DIR"
    expected = cache_root({"HF_HOME": str(tmp_path)}) / "staging" / cache_key("s3://bucket/runs/a")
    assert config.training.output_dir == str(expected)
    assert config.source_of("output_dir") == "MLM_STAGING_DIR"  # errors about the local directory name it
    assert config.as_dict()["output_store"] == "s3://bucket/runs/a"


def test_mlm_staging_dir_chooses_the_staging_directory_and_a_local_output_dir_ignores_it(tmp_path: Path) -> None:
    staged = load_config([], {"MLM_OUTPUT_DIR": "s3://bucket/a", "MLM_STAGING_DIR": str(tmp_path / "s")})
    assert staged.training.output_dir == str(tmp_path / "s")
    local = load_config([], {"MLM_OUTPUT_DIR": str(tmp_path / "out"), "MLM_STAGING_DIR": str(tmp_path / "s")})
    assert local.output_store is None and local.training.output_dir == str(tmp_path / "out")


def test_a_file_url_is_a_directory_and_an_unknown_protocol_is_refused(tmp_path: Path) -> None:
    assert load_config([], {"MLM_OUTPUT_DIR": f"file://{tmp_path}/out"}).training.output_dir == f"{tmp_path}/out"
    with pytest.raises(ConfigError, match=r"MLM_OUTPUT_DIR='nosuch://x/y': no filesystem for nosuch://"):
        load_config([], {"MLM_OUTPUT_DIR": "nosuch://x/y"})


def test_credentials_in_the_url_never_reach_run_json(tmp_path: Path) -> None:
    config = load_config([], {"MLM_OUTPUT_DIR": "s3://key:secret@bucket/a", "HF_HOME": str(tmp_path)})
    assert "secret" not in json.dumps(config.as_dict())


def mirror_of(bucket: str, tmp_path: Path, **env: str) -> Mirror:
    environ = {"MLM_OUTPUT_DIR": f"s3://{bucket}/run", "MLM_STAGING_DIR": str(tmp_path / "staging"), **env}
    config = load_config([], environ)
    RunFiles(config.training.output_dir).root.mkdir(parents=True, exist_ok=True)
    mirror = output_location(config)
    assert isinstance(mirror, Mirror)
    return mirror


def test_what_a_run_would_do_and_a_finished_model_refused(aws, bucket, tmp_path: Path) -> None:
    mirror = mirror_of(bucket, tmp_path)
    assert mirror.facts()["a run would"] == "start from step 0"
    mirror.store.upload_checkpoint(checkpoint(tmp_path / "local", 10))
    mirror.store.pipe(NAMES.checkpoint(20) / "config.json", b"{}")  # an upload cut off
    facts = mirror.facts()
    assert facts["a run would"] == "resume from checkpoint-10 (if it loads)"
    assert facts["complete_checkpoints"] == ["checkpoint-10"] and facts["incomplete_checkpoints"] == ["checkpoint-20"]
    mirror.store.pipe(NAMES.final / COMPLETE_MARKER, b"done")
    with pytest.raises(ConfigError, match=r"MLM_OUTPUT_DIR='s3://.*/run': holds a finished model in final/"):
        mirror.check()
    mirror.check(dry_run=True)  # plan reports it instead


def test_starting_over_keeps_the_finished_model_as_final_previous(aws, bucket, tmp_path: Path) -> None:
    mirror = mirror_of(bucket, tmp_path, MLM_OVERWRITE_OUTPUT_DIR="true")
    mirror.store.upload_checkpoint(checkpoint(tmp_path / "local", 10))
    mirror.store.pipe(NAMES.final / "config.json", b"{}")
    mirror.store.pipe(NAMES.final / COMPLETE_MARKER, b"done")
    said: list[str] = []
    assert mirror.choose_resume(said.append) is None
    assert not mirror.store.has_final() and mirror.store.exists(NAMES.final_previous / "config.json")
    assert mirror.store.checkpoint_steps() == {} and "starting over" in said[0]
    mirror.publish(lambda final: (final / "config.json").write_text("{}"))
    assert mirror.store.has_final() and not mirror.store.listing(NAMES.final_previous)


def test_a_cut_off_upload_is_uploaded_again_and_staging_keeps_only_the_choice(
    aws,
    bucket,
    tmp_path: Path,
) -> None:
    mirror = mirror_of(bucket, tmp_path)
    staging = mirror.files.root
    mirror.store.upload_checkpoint(checkpoint(staging, 10))
    checkpoint(staging, 20)
    mirror.store.pipe(NAMES.checkpoint(20) / "config.json", b"{}")  # the upload of 20 was cut off
    checkpoint(staging, 30)  # never reached the store at all: a staging outliving its store revives nothing
    (staging / "final").mkdir()
    mirror.store.pipe(NAMES.train_jsonl, b'{"event": "banner"}\n')
    said: list[str] = []
    chosen = mirror.choose_resume(said.append)
    assert chosen == str(staging / "checkpoint-20")
    assert "uploading checkpoint-20, which the last run saved but did not finish uploading" in said[0]
    assert mirror.store.complete_checkpoints() == [20, 10]
    assert [p.name for p in mirror.files.checkpoints()] == ["checkpoint-20"] and not (staging / "final").exists()
    assert mirror.files.train_jsonl.read_text() == '{"event": "banner"}\n'  # appended to by this run


def test_a_checkpoint_url_to_resume_from_is_downloaded(aws, bucket, tmp_path: Path) -> None:
    other = mirror_of(bucket, tmp_path / "other")
    other.store.upload_checkpoint(checkpoint(tmp_path / "local", 7))
    mirror = mirror_of(f"{bucket}/second", tmp_path, MLM_RESUME=f"s3://{bucket}/run/checkpoint-7")
    assert mirror.choose_resume(lambda _: None) == str(mirror.files.checkpoint(7))
    bad = mirror_of(f"{bucket}/third", tmp_path / "t", MLM_RESUME=f"s3://{bucket}/run/checkpoint-8")
    with pytest.raises(ConfigError, match=r"MLM_RESUME='s3://.*/checkpoint-8': no such checkpoint"):
        bad.choose_resume(lambda _: None)


def test_doctor_shows_the_store_what_a_run_would_do_and_the_lease_holder(aws, bucket, tmp_path: Path) -> None:
    from train.doctor.rows import OK, WARN
    from train.doctor.storage import check_output

    mirror = mirror_of(bucket, tmp_path)
    row = check_output(mirror)
    assert row.status == OK, row
    assert row.detail.startswith(f"s3://{bucket}/run: writable; a run would start from step 0; ")
    assert row.detail.endswith(f"GiB free in {mirror.files.root}")
    lease = mirror.lease()
    lease.acquire()
    try:
        held = check_output(mirror)
    finally:
        lease.release()
    assert held.status == WARN and "in use by another run (pid" in held.detail
    missing = check_output(mirror_of("no-such-bucket-anywhere", tmp_path))
    assert missing.status == "FAIL" and "the bucket does not exist" in missing.detail


def test_a_flipped_byte_in_the_stores_copy_is_set_aside_and_the_older_checkpoint_used(
    aws, bucket, tmp_path: Path
) -> None:
    mirror = mirror_of(bucket, tmp_path)
    mirror.store.upload_checkpoint(checkpoint(tmp_path / "local", 10))
    newest = checkpoint(tmp_path / "local", 20)
    mirror.store.upload_checkpoint(newest)
    stored = NAMES.checkpoint(20) / "optimizer.pt"
    # one bit, in the store only: what a flaky object store or a second writer leaves
    mirror.store.pipe(stored, flipped((newest / "optimizer.pt").read_bytes()))
    said: list[str] = []
    assert mirror.choose_resume(said.append) == str(mirror.files.checkpoint(10))
    assert "cannot resume from checkpoint-20 (optimizer.pt: its SHA-256 differs" in said[0]
    assert "resuming from checkpoint-10 instead" in said[0]
    # the same words and the same name as a directory's resume (train/outputs/checkpoints.py, set_aside)
    assert (
        said[0].startswith(f"{mirror.where}: cannot resume") and "; it was moved to .invalid-checkpoint-20-" in said[0]
    )
