"""output_dir in an object store, against a real S3-compatible server (moto's, on loopback) reached through a proxy
that fails the requests a test asks it to: markers written last and deleted first, rotation that never leaves zero
complete checkpoints, downloads that fall back from a damaged checkpoint, bounded retries, one-line errors with
their exit codes and never the secret key, and the lease's conditional create."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import checkpoint, flip, truncate
from tests.servers import S3_SECRET, FlakyProxy
from train.common.errors import EXIT_CONFIG, EXIT_ENVIRONMENT, ConfigError, EnvironmentProblem, UserError
from train.common.urls import is_store_url
from train.outputs.checkpoints import problem
from train.outputs.lease import EXPIRY_S
from train.outputs.retention import Retention
from train.outputs.runfiles import COMPLETE_MARKER, CUT_SHORT
from train.outputs.store import NAMES, Retry, Store
from train.outputs.store_lease import StoreLease, capabilities

# The fixtures (tests/conftest.py): aws (the AWS_* variables for the session's moto server, set here too), bucket
# (a fresh one there), proxy (in front of it, failing what a test tells it to), authenticating (a moto server that
# checks credentials).
SECRET = S3_SECRET  # the secret key of `aws`: must reach no message


class Said:
    """The store's warnings and waits, recorded (no real sleeping)."""

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.sleeps: list[float] = []


def make_store(url: str, proxy: FlakyProxy | None = None, said: Said | None = None, **retry: float) -> Store:
    said = said or Said()
    options = {"endpoint_url": proxy.url} if proxy else {}
    policy = Retry(sleep=said.sleeps.append, **{"attempts": 3, **retry})  # type: ignore[arg-type]
    return Store(url, retry=policy, storage_options=options, warn=said.warnings.append)


def digest(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.rglob("*")}


def puts(proxy: FlakyProxy) -> list[str]:
    return [path.split("?")[0] for method, path, failed in proxy.log if method == "PUT" and not failed]


def test_store_urls_are_urls_of_a_known_store_other_than_local_files() -> None:
    assert is_store_url("s3://bucket/run") and is_store_url("gs://bucket/run") and is_store_url("memory://run")
    assert not any(is_store_url(v) for v in ("/output", "output", "file:///output", "local://x", "nosuch://b/run"))


def test_a_checkpoint_counts_once_its_marker_is_uploaded_last(tmp_path, proxy, bucket) -> None:
    local = checkpoint(tmp_path, 10)
    before = digest(local)
    said = Said()
    store = make_store(f"s3://{bucket}/run", proxy, said)
    files = len([p for p in local.rglob("*") if p.is_file()]) - 1
    proxy.fail(100, "PUT", "500", after=files)  # every file goes up, then the store keeps failing
    with pytest.raises(EnvironmentProblem) as failed:
        store.upload_checkpoint(local)
    assert failed.value.exit_code == EXIT_ENVIRONMENT
    assert str(failed.value) == (
        f"MLM_OUTPUT_DIR='s3://{bucket}/run': writing checkpoint-10/.complete failed after 3 attempts "
        "(InternalError (injected by the test proxy)); the local copy is kept; expected a reachable store"
    )
    assert said.sleeps == [1.0, 2.0] and len(said.warnings) == 2
    assert store.checkpoint_steps() == {10: False} and store.complete_checkpoints() == []
    assert digest(local) == before  # a failed upload never touches the local copy
    proxy.heal()
    proxy.log.clear()
    assert store.upload_checkpoint(local) == 10
    uploaded = puts(proxy)
    assert uploaded[-1] == f"/{bucket}/run/checkpoint-10/{COMPLETE_MARKER}" and len(uploaded) == files + 1
    assert store.complete_checkpoints() == [10]


def test_rotation_keeps_the_newest_deletes_markers_first_and_never_leaves_none(tmp_path, proxy, bucket) -> None:
    store = make_store(f"s3://{bucket}/run", proxy)
    for step in (10, 20, 30):
        store.upload_checkpoint(checkpoint(tmp_path, step))
    store.pipe(NAMES.checkpoint(15) / "model.safetensors", b"cut off")  # an upload that never finished
    store.pipe(NAMES.checkpoint(40) / "model.safetensors", b"under way")  # newer than any complete one
    assert store.checkpoint_steps() == {10: True, 15: False, 20: True, 30: True, 40: False}
    proxy.log.clear()
    assert store.rotate(Retention(2)) == [10, 15]
    deletes = [(m, p.split("?")[0]) for m, p, _ in proxy.log if m in ("DELETE", "POST")]
    assert deletes[0] == ("DELETE", f"/{bucket}/run/checkpoint-10/{COMPLETE_MARKER}")
    assert store.complete_checkpoints() == [30, 20] and 40 in store.checkpoint_steps()
    assert store.rotate(Retention(1, every=20)) == [] and store.rotate(Retention(0)) == []  # step 20 kept; all kept
    assert (
        store.rotate(Retention(1)) == [20] and store.rotate(Retention(1)) == [] and store.complete_checkpoints() == [30]
    )
    # cut off between the marker and the rest: the checkpoint reads incomplete, and is tidied by the next rotation
    store.upload_checkpoint(checkpoint(tmp_path, 50))
    proxy.fail(100, "POST")  # the bulk delete of checkpoint-30's files
    with pytest.raises(EnvironmentProblem):
        store.rotate(Retention(1))
    proxy.heal()
    assert store.complete_checkpoints() == [50] and store.checkpoint_steps()[30] is False
    assert store.rotate(Retention(1)) == [30, 40]


# One byte of each kind of file the Trainer writes, flipped in the bucket (size kept: what a flaky store or a second
# writer does), and a file cut short; each named in the line that sets the checkpoint aside.
DAMAGE = [
    ("model.safetensors", truncate, "truncated"),
    *[
        (name, flip, "its SHA-256 differs from the marker's")
        for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json")
    ],
    ("config.json", lambda path: path.write_text("{ }"), "3 bytes, the marker says 2"),
]


@pytest.mark.parametrize(("name", "damage", "said"), DAMAGE, ids=[f"{n}-{d.__name__}" for n, d, _ in DAMAGE])
def test_a_damaged_newest_checkpoint_falls_back_to_the_older_one(tmp_path, aws, bucket, name, damage, said) -> None:
    store = make_store(f"s3://{bucket}/run")
    for step in (10, 20):
        store.upload_checkpoint(checkpoint(tmp_path / "trained", step))
    damaged = tmp_path / name
    damaged.write_bytes((tmp_path / "trained" / "checkpoint-20" / name).read_bytes())
    damage(damaged)  # complete in the bucket, then damaged: another writer, a broken copy, a flaky store
    store.put(damaged, NAMES.checkpoint(20) / name)
    staging = tmp_path / "staging"
    chosen, skipped = store.newest_resumable(staging)
    assert chosen == staging / "checkpoint-10" and problem(chosen) is None
    assert [step for step, _ in skipped] == [20]
    assert skipped[0][1].startswith(f"{name}: {said}"), skipped
    assert sorted(p.name for p in staging.iterdir()) == ["checkpoint-10"]
    assert digest(chosen) == digest(tmp_path / "trained" / "checkpoint-10")


def test_a_download_cut_off_leaves_no_checkpoint_behind(tmp_path, proxy, bucket) -> None:
    store = make_store(f"s3://{bucket}/run", proxy)
    store.upload_checkpoint(checkpoint(tmp_path / "trained", 10))
    proxy.fail(100, "GET", "500", after=3)  # the listing and the first files, then the store fails
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(EnvironmentProblem, match=r"reading checkpoint-10/\S+ failed after 3 attempts"):
        store.download_checkpoint(10, staging)
    assert list(staging.iterdir()) == []  # neither checkpoint-10 nor the partial download


@pytest.mark.parametrize("how", ["500", "503", "close"])
def test_transient_failures_mid_upload_are_retried(tmp_path, proxy, bucket, how) -> None:
    said = Said()
    store = make_store(f"s3://{bucket}/run", proxy, said)
    proxy.fail(2, "PUT", how, after=2)
    store.upload_checkpoint(checkpoint(tmp_path, 10))
    assert proxy.failed == 2 and store.complete_checkpoints() == [10]
    if how == "500":  # InternalError reaches the store (botocore's retries are off here); s3fs retries the others
        assert said.sleeps == [1.0, 2.0]


def test_retries_are_bounded_in_total_time(proxy, bucket) -> None:
    said, clock = Said(), [0.0]

    def sleep(seconds: float) -> None:
        said.sleeps.append(seconds)
        clock[0] += seconds

    retry = Retry(attempts=10, first_s=1.0, total_s=5.0, sleep=sleep, clock=lambda: clock[0])
    store = Store(
        f"s3://{bucket}/run", retry=retry, storage_options={"endpoint_url": proxy.url}, warn=said.warnings.append
    )
    proxy.fail(100, "PUT")
    with pytest.raises(EnvironmentProblem, match="failed after 3 attempts"):
        store.preflight()
    assert said.sleeps == [1.0, 2.0]  # a third wait (4 s) would pass the 5 s


def one_line(error: UserError) -> str:
    message = str(error)
    assert "\n" not in message and SECRET not in message and message.startswith("MLM_OUTPUT_DIR='s3://")
    return message


def test_a_missing_bucket_is_a_configuration_error(aws) -> None:
    store = make_store("s3://no-such-bucket-for-mlm/run")
    with pytest.raises(ConfigError) as failed:
        store.preflight()
    assert failed.value.exit_code == EXIT_CONFIG
    assert one_line(failed.value) == (
        "MLM_OUTPUT_DIR='s3://no-such-bucket-for-mlm/run': the bucket does not exist (The specified bucket does not "
        "exist); expected an existing bucket: create it or correct the URL"
    )


def test_a_store_that_keeps_failing_is_an_environment_error(proxy, bucket) -> None:
    said = Said()
    store = make_store(f"s3://{bucket}/run", proxy, said)
    proxy.fail(100, "PUT")
    with pytest.raises(EnvironmentProblem) as failed:
        store.preflight()
    assert failed.value.exit_code == EXIT_ENVIRONMENT and "failed after 3 attempts" in one_line(failed.value)
    assert not any(SECRET in warning for warning in said.warnings)


def test_wrong_or_missing_credentials_are_an_environment_error_without_the_secret(
    aws, authenticating, monkeypatch
) -> None:
    url, key_id, secret = authenticating
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    store = make_store("s3://guarded/run")
    store.fs.mkdir("guarded")
    store.preflight()  # the right credentials: fine
    expected = {
        (key_id, SECRET): "The request signature we calculated does not match the signature you provided",
        ("AKIANOSUCHKEY0000000", SECRET): "The AWS Access Key Id you provided does not exist in our records",
        (None, None): "Unable to locate credentials",
    }
    for (key, wrong), said in expected.items():
        for name, value in (("AWS_ACCESS_KEY_ID", key), ("AWS_SECRET_ACCESS_KEY", wrong)):
            monkeypatch.setenv(name, value) if value else monkeypatch.delenv(name)
        with pytest.raises(EnvironmentProblem) as failed:
            make_store("s3://guarded/run").preflight()
        assert failed.value.exit_code == EXIT_ENVIRONMENT
        assert one_line(failed.value).startswith("MLM_OUTPUT_DIR='s3://guarded/run': writing .write-test-")
        assert f"was refused ({said}" in str(failed.value) and "AWS_ACCESS_KEY_ID" in str(failed.value)
        assert secret not in str(failed.value)


def test_final_is_published_weights_then_marker_last_and_replaces_the_old_one(tmp_path, proxy, bucket) -> None:
    store = make_store(f"s3://{bucket}/run", proxy)
    old = tmp_path / "old"
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"old weights")
    (old / "vocab.txt").write_text("old only")
    store.publish_final(old)
    new = tmp_path / "new"
    new.mkdir()
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        (new / name).write_text(name)
    proxy.log.clear()
    store.publish_final(new)
    final = f"/{bucket}/run/final/"
    assert [p.removeprefix(final) for p in puts(proxy)] == [
        "config.json",
        "tokenizer.json",
        "model.safetensors",
        COMPLETE_MARKER,
    ]
    assert sorted(str(p) for p in store.listing(NAMES.final)) == [
        f"final/{COMPLETE_MARKER}",
        "final/config.json",
        "final/model.safetensors",
        "final/tokenizer.json",
    ]
    assert store.has_final()
    stopped = tmp_path / "stopped"  # a stopped budgeted run's model (train/run/budget.py): no finished one
    shutil.copytree(new, stopped)
    (stopped / CUT_SHORT).write_text("{}")
    store.publish_final(stopped)
    assert store.exists(NAMES.final / "model.safetensors") and not store.has_final()


def test_run_files_are_mirrored_and_missing_ones_skipped(tmp_path, aws, bucket) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "train.jsonl").write_text('{"loss": 1}\n')
    (tmp_path / "run.json").write_text("{}")
    store = make_store(f"s3://{bucket}/run")
    uploaded = store.upload(tmp_path, NAMES.run_json, NAMES.all_results, NAMES.logs, NAMES.report)
    assert uploaded == [NAMES.run_json, NAMES.train_jsonl]
    assert [str(p) for p in store.listing()] == ["logs/train.jsonl", "run.json"]


def test_the_store_honours_conditional_writes(aws, bucket) -> None:
    assert capabilities(make_store(f"s3://{bucket}/run")) == (True, True)
    assert make_store(f"s3://{bucket}/run").listing() == []  # the probe is removed


class Racing(StoreLease):
    """A job whose write waits for its rival's: both have judged the lease free (``at="create"``) or stale
    (``at="take_over"``) before either writes, the moment a conditional write must decide."""

    def __init__(self, store: Store, gate: threading.Barrier, at: str) -> None:
        super().__init__(store)
        self.gate, self.at = gate, at

    def _create(self) -> bool:
        if self.at == "create":
            self.gate.wait(timeout=10)
        return super()._create()

    def _take_over(self) -> bool:
        if self.at == "take_over":
            self.gate.wait(timeout=10)
        return super()._take_over()


def race(url: str, at: str) -> tuple[list[StoreLease], list[BaseException | None]]:
    """Two jobs acquiring the lease at once: the leases, and what each acquire raised (None: it holds the lease)."""
    gate = threading.Barrier(2)
    leases: list[StoreLease] = [Racing(make_store(url), gate, at) for _ in range(2)]
    outcome: list[BaseException | None] = [None] * 2

    def take(index: int) -> None:
        try:
            leases[index].acquire()
        except BaseException as exc:  # noqa: BLE001 - recorded for the test to judge
            outcome[index] = exc

    threads = [threading.Thread(target=take, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return leases, outcome


def test_of_two_jobs_creating_the_lease_at_once_one_wins(aws, bucket) -> None:
    store = make_store(f"s3://{bucket}/run")
    leases, outcome = race(f"s3://{bucket}/run", "create")
    try:
        assert sorted(x is None for x in outcome) == [False, True]
        loser = next(x for x in outcome if x is not None)
        assert isinstance(loser, EnvironmentProblem) and loser.exit_code == EXIT_ENVIRONMENT
        assert str(loser).startswith(f"MLM_OUTPUT_DIR='s3://{bucket}/run' is in use by another run (pid ")
        winner = leases[outcome.index(None)]
        record = json.loads(store.fs.cat_file(store.key(NAMES.lease)))
        assert record["token"] == winner.token and {"host", "pid", "started", "renewed"} <= set(record)
    finally:
        for lease in leases:
            lease.release()
    assert not store.exists(NAMES.lease)


def test_a_stale_lease_is_taken_over_by_exactly_one_job_and_a_live_one_is_not(aws, bucket) -> None:
    store = make_store(f"s3://{bucket}/run")
    lost = {
        "token": "gone",
        "host": "a-lost-node",
        "pid": 7,
        "started": "yesterday",
        "renewed": time.time() - EXPIRY_S - 5,
    }
    store.pipe(NAMES.lease, json.dumps(lost).encode())
    leases, outcome = race(f"s3://{bucket}/run", "take_over")
    try:
        assert sorted(x is None for x in outcome) == [False, True]
        winner = leases[outcome.index(None)]
        assert json.loads(store.fs.cat_file(store.key(NAMES.lease)))["token"] == winner.token
        # taken over in turn (this job was judged lost): its heartbeat does not overwrite the new holder's lease
        store.pipe(NAMES.lease, json.dumps({**lost, "token": "newer", "renewed": time.time()}).encode())
        assert winner._write(IfMatch=winner.etag) is False
    finally:
        for lease in leases:
            lease.release()
    live = {**lost, "renewed": time.time()}
    store.pipe(NAMES.lease, json.dumps(live).encode())
    with pytest.raises(EnvironmentProblem, match=r"in use by another run \(pid 7 on a-lost-node, since yesterday\)"):
        StoreLease(make_store(f"s3://{bucket}/run")).acquire()


def test_where_the_store_ignores_conditions_the_lease_falls_back_and_says_so(aws, bucket, monkeypatch) -> None:
    import train.outputs.store_lease

    monkeypatch.setattr(train.outputs.store_lease, "capabilities", lambda store: (False, False))
    said = Said()
    lease = StoreLease(make_store(f"s3://{bucket}/run", said=said))
    lease.settle_s = 0.05
    lease.acquire()
    try:
        assert said.warnings == [
            f"MLM_OUTPUT_DIR='s3://{bucket}/run': the store does not honour conditional writes (If-None-Match): "
            "the lease cannot stop two jobs started at the same moment; start one job per output_dir"
        ]
        with pytest.raises(EnvironmentProblem, match="is in use by another run"):
            StoreLease(make_store(f"s3://{bucket}/run")).acquire()
    finally:
        lease.release()
    assert not make_store(f"s3://{bucket}/run").exists(NAMES.lease)
