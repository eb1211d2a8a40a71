"""A corpus on S3 (a real S3-compatible server on loopback, moto's): read through fsspec/s3fs in memory and
streamed, credentials from the usual AWS_* variables and never shown."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.conftest import tiny_env
from tests.data.helpers import config_for, corpus_line, raw_of
from tests.e2e.runs import entrypoint
from train.common.errors import ConfigError
from train.data import load_raw

pytestmark = pytest.mark.slow

SECRET = "s3-secret-canary-5ad1c0de"  # the secret key: must not reach any output
BUCKET = "corpus"
LINES = [corpus_line(i) for i in range(240)]


@pytest.fixture(scope="module")
def s3_env(s3_endpoint: str) -> dict[str, str]:
    """The variables a user sets for S3, and a bucket holding three gzipped JSON-lines parts of LINES."""
    import boto3

    env = {
        "AWS_ACCESS_KEY_ID": "mlm-tests",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3_endpoint,
    }
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=BUCKET)
    for part in range(3):
        rows = "\n".join(json.dumps({"text": t}) for t in LINES[part * 80 : (part + 1) * 80]) + "\n"
        client.put_object(Bucket=BUCKET, Key=f"train/part-{part}.jsonl.gz", Body=gzip.compress(rows.encode()))
    client.put_object(Bucket=BUCKET, Key="train/_SUCCESS", Body=b"")  # a marker file, not data
    return env


@pytest.fixture
def with_s3(monkeypatch: pytest.MonkeyPatch, s3_env: dict[str, str]) -> dict[str, str]:
    for name, value in s3_env.items():
        monkeypatch.setenv(name, value)
    return s3_env


@pytest.mark.parametrize("source", [f"s3://{BUCKET}/train/*.jsonl.gz", f"s3://{BUCKET}/train"])
def test_an_s3_glob_or_prefix_reads_in_memory(with_s3: dict[str, str], source: str) -> None:
    raw = raw_of(config_for(source, validation_split_percentage="10"))
    assert list(raw.splits["train"]["text"]) + list(raw.splits["validation"]["text"]) == LINES


def test_an_s3_glob_streams(with_s3: dict[str, str]) -> None:
    config = config_for(f"s3://{BUCKET}/train/*.jsonl.gz", streaming="true", max_steps="5", max_eval_samples="10")
    raw = load_raw(config.data, config.training)
    assert raw.stream is not None
    assert list(raw.splits["validation"]["text"]) == LINES[:10]
    assert list(raw.stream.texts()) == LINES[10:]


def test_wrong_credentials_or_a_missing_prefix_are_one_line_without_the_secret(
    with_s3: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match=r"MLM_DATASET='s3://corpus/nothing/\*\.txt': the pattern matches no file"):
        raw_of(config_for(f"s3://{BUCKET}/nothing/*.txt"))
    with pytest.raises(ConfigError, match=r"MLM_DATASET='s3://no-such-bucket/x.txt': no such file or prefix"):
        raw_of(config_for("s3://no-such-bucket/x.txt"))


def test_an_s3_corpus_trains_through_the_entrypoint_offline_and_the_secret_stays_out(
    tmp_path: Path, s3_env: dict[str, str]
) -> None:
    """The credentials reach the ranks through the launcher and torchrun, and no output holds the secret: once,
    streamed (both readers, offline, are the in-process tests above)."""
    output = tmp_path / "out"
    env = tiny_env(
        output,
        dataset=f"s3://{BUCKET}/train/*.jsonl.gz",
        streaming="true",
        max_steps="6",
        max_eval_samples="16",
        per_device_train_batch_size="8",
    )
    env.update(s3_env)
    assert env["HF_HUB_OFFLINE"] == "1"  # "no hub", as the README tells offline users: other stores stay readable
    done = entrypoint(env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (output / "final" / "model.safetensors").exists()
    facts = json.loads((output / "run.json").read_text())
    assert facts["config"]["dataset"] == f"s3://{BUCKET}/train/*.jsonl.gz"
    written = [done.stdout, done.stderr] + [
        p.read_text(errors="replace")
        for p in output.rglob("*")
        if p.is_file() and p.suffix in (".json", ".jsonl", ".html", ".txt")
    ]
    assert not any(SECRET in text for text in written)


def test_doctor_lists_an_s3_source_as_the_job_would(with_s3: dict[str, str], tmp_path: Path) -> None:
    from train.doctor.rows import FAIL, OK
    from train.doctor.sources import check_files

    found = check_files(f"s3://{BUCKET}/train/*.jsonl.gz", "MLM_DATASET")
    assert (found.status, found.detail) == (OK, f"s3://{BUCKET}/train/*.jsonl.gz: 3 remote json file(s)")
    missing = check_files("s3://no-such-bucket/x.txt", "MLM_DATASET")
    assert missing.status == FAIL and "no such file or prefix" in missing.detail
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(b"some text here\n"))
    assert check_files(str(tmp_path / "*.txt.gz"), "MLM_DATASET").detail.endswith("1 local text file(s)")
