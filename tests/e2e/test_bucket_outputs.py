"""output_dir in a bucket (``MLM_OUTPUT_DIR=s3://...``) through the real front door (./entrypoint.sh -> launcher ->
torchrun -> ranks) against a real S3-compatible server (moto's, on loopback): a SIGTERM after a checkpoint reached
the bucket, a fresh machine (empty staging, empty cache) resuming from it with weights bit-identical to an
uninterrupted run, a model evaluated from the bucket into it, a missing bucket, refused credentials, a server
failing mid-upload, and the secret key in no log or file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.conftest import tiny_env
from tests.e2e.runs import REPO_ID, entrypoint, launcher_here, node_env, push_env, start
from tests.hub_server import HubServer
from tests.servers import S3_SECRET, FlakyProxy, aws_environment, free_port

pytestmark = pytest.mark.slow

# The fixtures: aws, bucket, proxy, authenticating (tests/conftest.py: moto's S3 servers), hub and mlflow_server
# (tests/e2e/conftest.py).
SECRET = S3_SECRET  # the secret key of `aws`: must reach no log, file or object
# 512 demo training samples in batches of 16: 32 steps, a checkpoint every 10, no dataloader workers.
RESUMABLE = {"demo_samples": "640", "per_device_train_batch_size": "16", "save_strategy": "steps", "save_steps": "10"}


def filesystem(aws: dict[str, str]):  # noqa: ANN201 - s3fs is imported here only
    import s3fs

    return s3fs.S3FileSystem(
        key=aws["AWS_ACCESS_KEY_ID"],
        secret=aws["AWS_SECRET_ACCESS_KEY"],
        endpoint_url=aws["AWS_ENDPOINT_URL"],
        skip_instance_cache=True,
    )


def machine_env(
    tmp_path: Path, url: str, aws: dict[str, str], machine: str, cache: Path | None = None, **options: str
) -> dict[str, str]:
    """A run on its own "machine": its own staging directory and its own (empty at first) cache, or the cache of
    the machine whose directory is ``cache``."""
    env = tiny_env(tmp_path / machine / "unused", log_format="text", **{**RESUMABLE, **options})
    env.update(aws)
    env.update(
        MLM_OUTPUT_DIR=url,
        MLM_STAGING_DIR=str(tmp_path / machine / "staging"),
        HF_HOME=str((cache or tmp_path / machine) / "hf"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    return env


def wait_for_object(aws: dict[str, str], key: str, process: subprocess.Popen, timeout: float = 300) -> None:
    fs, deadline = filesystem(aws), time.monotonic() + timeout
    while not fs.exists(key):
        assert process.poll() is None, f"exited {process.returncode} before {key} appeared: {process.stderr.read()}"
        assert time.monotonic() < deadline, f"{key} did not appear in {timeout} s"
        time.sleep(0.3)
        fs.invalidate_cache()


def complete_steps(aws: dict[str, str], prefix: str) -> list[int]:
    fs = filesystem(aws)
    return sorted(int(key.split("/")[-2].split("-")[1]) for key in fs.glob(f"{prefix}/checkpoint-*/.complete"))


def assert_no_secret(aws: dict[str, str], prefix: str | None, *places: Path, texts: tuple[str, ...] = ()) -> None:
    for text in texts:
        assert SECRET not in text
    for place in places:
        for path in (p for p in place.rglob("*") if p.is_file()):
            assert SECRET.encode() not in path.read_bytes(), path
    fs = filesystem(aws)
    for key in fs.find(prefix) if prefix else []:
        assert SECRET.encode() not in fs.cat_file(key), key


class Straight(NamedTuple):
    """The uninterrupted run: its bucket, the directory of its machine ("a": staging, cache, token file) and what it
    wrote to stderr."""

    bucket: str
    machine: Path
    stderr: str


@pytest.fixture(scope="module")
def straight(
    tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str, hub: HubServer, mlflow_server: str
) -> Straight:
    """The uninterrupted run into a bucket of its own, pushing to the hub and logging its model to MLflow: one run
    that both the resume on a fresh machine (its weights) and the push (the hub's and MLflow's copies) are checked
    against. The push and the tracker change no weight: a change would show as the resume's weights differing."""
    root, aws = tmp_path_factory.mktemp("straight"), aws_environment(s3_endpoint, S3_SECRET)
    name = f"bucket-{uuid.uuid4().hex[:12]}"
    filesystem(aws).mkdir(name)
    hub.reset()
    env = push_env(root / "out", hub)
    env.update(machine_env(root, f"s3://{name}/straight", aws, "a", push_to_hub="true", report_to="mlflow"))
    env.update(MLFLOW_TRACKING_URI=mlflow_server, MLFLOW_EXPERIMENT_NAME=f"bucket-{name}")
    env.pop("HF_HUB_OFFLINE", None)  # the push needs the hub; the data and the model are local anyway
    done = entrypoint(env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"finished: model in s3://{name}/straight/final" in done.stderr
    return Straight(name, root / "a", done.stderr)


def test_a_stopped_run_resumes_on_a_fresh_machine_from_the_bucket_with_identical_weights(
    tmp_path: Path, aws: dict[str, str], bucket: str, straight: Straight
) -> None:
    # evaluate-only, from the bucket to the bucket, on a machine with nothing of a's: the model downloaded and
    # verified, the figures written there. (A damaged checkpoint in the bucket set aside for the one before:
    # tests/test_mirror.py, tests/test_store.py.)
    fs, model = filesystem(aws), f"s3://{straight.bucket}/straight/final"
    scored = entrypoint(
        "evaluate", "--model_name_or_path", model, env=machine_env(tmp_path, f"s3://{bucket}/scores", aws, "e")
    )
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert f"{model}: intact" in scored.stderr
    results = json.loads(fs.cat_file(f"{bucket}/scores/eval_results.json"))
    assert results["model"] == model and results["eval_loss"] > 0

    # The same machine's cache, so the same tokenizer: two trainings of one differ (train/model/tokenizer_training.py).
    url = f"s3://{bucket}/run"
    first = start(env=machine_env(tmp_path, url, aws, "b", cache=straight.machine))
    wait_for_object(aws, f"{bucket}/run/checkpoint-10/.complete", first)
    first.send_signal(signal.SIGTERM)
    _, stopped = first.communicate(timeout=120)  # a bound against a hang, not a measurement
    assert first.returncode == 75, stopped[-3000:]
    assert max(complete_steps(aws, f"{bucket}/run")) >= 10
    assert not fs.exists(f"{bucket}/run/final")

    resumed = entrypoint(env=machine_env(tmp_path, url, aws, "c"))  # another machine: nothing of b's
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr
    weights = "final/model.safetensors"
    assert fs.cat_file(f"{bucket}/run/{weights}") == fs.cat_file(f"{straight.bucket}/straight/{weights}")
    assert fs.exists(f"{bucket}/run/final/.complete") and fs.exists(f"{bucket}/run/run.json")
    history = fs.cat_file(f"{bucket}/run/logs/train.jsonl").decode()
    assert history.count('"event": "banner"') == 2  # the stopped run's log, appended to on the other machine
    assert_no_secret(aws, f"{bucket}/run", tmp_path, straight.machine, texts=(straight.stderr, stopped, resumed.stderr))


# The two refusals below are the launcher's (its output check, before torchrun): its main() in this process, with the
# run's AWS_* variables in this process's environment too (botocore reads them there).


def test_a_missing_bucket_is_exit_2_before_training(tmp_path: Path, aws: dict[str, str], capsys: Any) -> None:
    code, said = launcher_here(capsys, machine_env(tmp_path, "s3://no-such-bucket-here/run", aws, "a"), "train")
    assert code == 2, said[-3000:]
    assert "MLM_OUTPUT_DIR='s3://no-such-bucket-here/run': the bucket does not exist" in said
    assert "Traceback" not in said and "Tokenizing" not in said
    assert_no_secret(aws, None, tmp_path, texts=(said, capsys.readouterr().out))


def test_refused_credentials_are_exit_3_before_training(
    tmp_path: Path,
    aws: dict[str, str],
    authenticating: tuple[str, str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:
    endpoint, key_id, _ = authenticating
    env = machine_env(tmp_path, "s3://any-bucket/run", {**aws, "AWS_ENDPOINT_URL": endpoint}, "a")
    env["AWS_ACCESS_KEY_ID"] = key_id  # a key the server knows, with the wrong secret
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID"):
        monkeypatch.setenv(name, env[name])
    code, said = launcher_here(capsys, env, "train")
    assert code == 3, said[-3000:]
    assert "MLM_OUTPUT_DIR='s3://any-bucket/run':" in said and "refused" in said
    assert SECRET not in said + capsys.readouterr().out and "Tokenizing" not in said


def test_a_server_failing_mid_upload_is_exit_3_and_the_next_run_uploads_what_was_kept(
    tmp_path: Path, aws: dict[str, str], bucket: str, proxy: FlakyProxy
) -> None:
    url, fs, prefix = f"s3://{bucket}/run", filesystem(aws), f"{bucket}/run"
    env = machine_env(tmp_path, url, {**aws, "AWS_ENDPOINT_URL": proxy.url}, "a", store_retry_timeout="3")
    proxy.fail(1000, "PUT", "500", after=2, where="/run/checkpoint-10/")  # two files land, then none
    failed = entrypoint(env=env)
    assert failed.returncode == 3, failed.stderr[-3000:]
    said = failed.stderr.strip().splitlines()[-2]  # the rank's line; the launcher's last points at it
    assert "writing checkpoint-10/" in said and "the local copy is kept" in said, failed.stderr[-3000:]
    assert "Traceback" not in failed.stderr
    staged = tmp_path / "a" / "staging" / "checkpoint-10"
    assert (staged / "model.safetensors").is_file() and (staged / ".complete").is_file()
    assert not complete_steps(aws, prefix)

    proxy.heal()
    again = entrypoint(env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "uploading checkpoint-10, which the last run saved but did not finish uploading" in again.stderr
    assert "resuming from" in again.stderr and fs.exists(f"{prefix}/final/.complete")


def test_two_nodes_with_their_own_staging_resume_from_the_bucket(
    tmp_path: Path, aws: dict[str, str], bucket: str
) -> None:
    """Two nodes sharing no volume (each its own staging directory and cache), as a PyTorchJob's pods, training
    sharded (MLM_SHARDING=fsdp: each rank writes its own optimizer shard): stopped after a checkpoint reached the
    bucket, then started again on fresh machines, they resume from it together."""
    url, fs, prefix = f"s3://{bucket}/run", filesystem(aws), f"{bucket}/run"

    def nodes(machines: str) -> list[subprocess.Popen]:
        port = free_port()
        envs = [node_env(tmp_path / machines, rank, port) for rank in (0, 1)]
        for rank, env in enumerate(envs):
            env.update(aws, MLM_OUTPUT_DIR=url, MLM_STAGING_DIR=str(tmp_path / machines / f"staging{rank}"))
            env.update({f"MLM_{k.upper()}": v for k, v in {**RESUMABLE, "sharding": "fsdp"}.items()})
        return [start("train", env=env, stderr=subprocess.STDOUT) for env in envs]

    def ends(started: list[subprocess.Popen]) -> list[tuple[int, str]]:
        try:
            return [(node.wait(timeout=600), node.communicate()[0]) for node in started]
        finally:
            for node in started:
                if node.poll() is None:
                    node.kill()

    first = nodes("first")
    wait_for_object(aws, f"{prefix}/checkpoint-10/.complete", first[0])
    for node in first:
        node.send_signal(signal.SIGTERM)
    for code, log in ends(first):
        assert code == 75, log[-3000:]
    saved = max(complete_steps(aws, prefix))
    rng = {Path(key).name for key in fs.glob(f"{prefix}/checkpoint-{saved}/rng_state_*.pth")}
    assert rng == {"rng_state_0.pth", "rng_state_1.pth"}  # each node uploaded its own rank's
    for state in ("model_dcp", "optimizer_dcp"):  # and its shard of the weights and of the optimizer
        shards = {Path(key).name for key in fs.glob(f"{prefix}/checkpoint-{saved}/{state}/*")}
        assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= shards, (state, shards)

    again = ends(nodes("second"))  # fresh machines: empty staging directories and caches
    for code, log in again:
        assert code == 0, log[-3000:]
    assert f"resuming from {tmp_path / 'second' / 'staging0' / f'checkpoint-{saved}'}" in again[0][1]
    assert (tmp_path / "second" / "staging1" / f"checkpoint-{saved}" / "rng_state_1.pth").is_file()
    assert fs.exists(f"{prefix}/final/.complete")
    facts = json.loads(fs.cat_file(f"{prefix}/run.json"))
    assert facts["sharding"]["mode"] == "fsdp" and facts["status"] == "finished", facts["sharding"]


def test_a_bucket_run_pushes_to_the_hub_and_logs_its_model_to_mlflow(
    aws: dict[str, str], hub: HubServer, mlflow_server: str, straight: Straight
) -> None:
    """The hub push and MLflow's artifact upload read the staged final/: the same bytes as the bucket's."""
    from mlflow.tracking import MlflowClient

    fs, final = filesystem(aws), f"{straight.bucket}/straight/final"
    weights = fs.cat_file(f"{final}/model.safetensors")
    assert hub.repos[REPO_ID].files["model.safetensors"] == weights
    assert fs.cat_file(f"{final}/README.md") == hub.repos[REPO_ID].files["README.md"]  # the card, in the bucket too
    client = MlflowClient(tracking_uri=mlflow_server)
    [run] = client.search_runs([client.get_experiment_by_name(f"bucket-{straight.bucket}").experiment_id])
    assert "final/model.safetensors" in {a.path for a in client.list_artifacts(run.info.run_id, "final")}


def test_a_crashed_ranks_traceback_reaches_the_bucket(tmp_path: Path, aws: dict[str, str], bucket: str) -> None:
    # The Trainer looks the metric up after the evaluation at step 10 and raises: a mistake found mid-run.
    options = {"eval_strategy": "steps", "eval_steps": "10", "metric_for_best_model": "nope"}
    result = entrypoint(env=machine_env(tmp_path, f"s3://{bucket}/run", aws, "a", **options))
    assert result.returncode == 1, result.stderr[-3000:]
    assert "rank 0 crashed: KeyError" in result.stderr
    assert b"Traceback" in filesystem(aws).cat_file(f"{bucket}/run/logs/crash-rank-0.txt")


def test_a_second_job_on_the_same_bucket_is_refused_and_the_first_is_unharmed(
    tmp_path: Path, aws: dict[str, str], bucket: str
) -> None:
    url = f"s3://{bucket}/run"
    # 1,600 steps, still running: 50 epochs of 32 (32,000 samples for one epoch would cost their tokenizing first)
    first = start(env=machine_env(tmp_path, url, aws, "a", num_train_epochs="50"))
    wait_for_object(aws, f"{bucket}/run/checkpoint-10/.complete", first)
    second = entrypoint(env=machine_env(tmp_path, url, aws, "b"))
    assert second.returncode == 3, second.stderr[-3000:]
    assert f"MLM_OUTPUT_DIR='{url}' is in use by another run (pid" in second.stderr
    assert first.poll() is None, "the first job ended while the second started"
    first.send_signal(signal.SIGTERM)
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 75, stderr[-3000:]  # it saved and uploaded as if alone
    assert "uploaded checkpoint-" in stderr and max(complete_steps(aws, f"{bucket}/run")) >= 10
