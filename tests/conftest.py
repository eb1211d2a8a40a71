"""Shared fixtures: a clean MLM_* environment, a per-session HF cache, the tiny demo job's environment, and the S3
servers (moto on loopback; tests/servers.py) with their variables, buckets and failing proxy. The end-to-end
tests' own fixtures (the hub, mlflow, ...) are in tests/e2e/conftest.py."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import S3_SECRET, FlakyProxy, aws_environment, flaky_proxy, s3_server, s3_server_with_user

REPO = Path(__file__).resolve().parent.parent
# The caller's shell must not change what the tests see: HF_HUB_OFFLINE=1 (which the README tells offline users to
# set) or a stray MLM_* option would reach every run the tests start, and huggingface_hub reads its variables once,
# when it is first imported - so they go here, before any test module imports it. Tests set what they need.
CALLER_PREFIXES = ("MLM_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "WANDB_", "MLFLOW_", "PET_", "SLURM_")
for _name in [name for name in os.environ if name.startswith(CALLER_PREFIXES)]:
    del os.environ[_name]
# Offline from the first import on: huggingface_hub and datasets read these once, so a test that sets them later
# (the fixture below, for the runs it starts) leaves the libraries in this process trying the unreachable hub -
# 45 s of retries for one test.
os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")

# The end-to-end modules that take longest (minutes of runs each on CI's 2 cores; the sums of make test's
# --durations=0 per module), first: `make test` runs the end-to-end tests two at a time, a module per worker
# (pytest-xdist's loadfile) in the order collected (--no-loadscope-reorder: xdist would otherwise send the modules with
# the most tests first), so a long module collected last would leave one core idle while it runs alone at the end.
LONGEST_FIRST = (
    "tests/e2e/test_reliability.py",
    "tests/e2e/test_sharding.py",
    "tests/e2e/test_bucket_outputs.py",
    "tests/e2e/test_streaming.py",
    "tests/e2e/test_job.py",
    "tests/e2e/test_replay.py",
    "tests/e2e/test_hang.py",
    "tests/e2e/test_models.py",
    "tests/e2e/test_model_matrix.py",
    "tests/e2e/test_phases.py",
    "tests/e2e/test_crash_ends.py",
    "tests/e2e/test_readme.py",
    "tests/e2e/test_presets.py",
    "tests/e2e/test_packing_runs.py",
    "tests/e2e/test_branches.py",
    "tests/e2e/test_two_hosts.py",
    "tests/e2e/test_finetune.py",
    "tests/e2e/test_multinode.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests of the LONGEST_FIRST modules first, in that order; every other test after them, as collected."""
    rank = {module: index for index, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(autouse=True)
def _no_user_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests pass their options explicitly; stray MLM_* variables from the caller's shell must not leak in."""
    for name in list(os.environ):
        if name.startswith("MLM_") or name in ("HF_TOKEN", "HF_TOKEN_FILE"):
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _progress_bars_restored() -> Iterator[None]:
    """A command's main() run in-process (evaluate, finetune) turns the libraries' progress bars off for JSON logs
    (train/run/logs.py configure_console), for the whole process: on again after the test, as a new process has them."""
    import datasets

    shown = datasets.is_progress_bar_enabled()
    yield
    if shown and not datasets.is_progress_bar_enabled():
        datasets.enable_progress_bars()


@pytest.fixture(scope="session")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One HF cache for the session (trained tokenizers and tokenized data are reused across tests)."""
    return tmp_path_factory.mktemp("hf-home")


@pytest.fixture(autouse=True, scope="session")
def _offline_cache(hf_home: Path) -> Iterator[None]:
    """The session's cache for every run a test starts, module fixtures' runs included (a session fixture is set up
    before them; a test's own monkeypatch of these is undone after it, back to these)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", str(hf_home))
        patch.setenv("HF_HUB_OFFLINE", "1")  # the hub is unreachable here; fail fast instead of retrying
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        yield


def tiny_env(output_dir: Path, **options: str) -> dict[str, str]:
    """The environment of a tiny demo run: a 2-layer DistilBERT from scratch on 400 demo samples, one epoch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLM_")}
    env.update(
        MLM_CONFIG=str(REPO / "configs" / "demo.yaml"),
        MLM_DEMO_SAMPLES="400",
        MLM_NUM_TRAIN_EPOCHS="1",
        MLM_DATALOADER_NUM_WORKERS="0",
        MLM_OUTPUT_DIR=str(output_dir),
        PYTHONPATH=str(REPO),
    )
    env.update({f"MLM_{k.upper()}": v for k, v in options.items()})
    return env


def run_torchrun(env: dict[str, str], nproc: int = 1, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """The per-rank job under a real torchrun (gloo on CPU), as the launcher would start it."""
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", f"--nproc-per-node={nproc}", "-m", "train.run.job"]
    # As the launcher decides on CPU: gloo, and --use_cpu so that CPU ranks really form DDP (without it each
    # rank trains its own copy).
    command += ["--ddp_backend", "gloo", "--use_cpu", "true"]
    return subprocess.run(
        [*command, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


# --- S3 (moto's server on loopback) ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One S3-compatible server (moto) on loopback for the session; its endpoint URL."""
    with s3_server(tmp_path_factory.mktemp("s3") / "moto.log") as url:
        yield url


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, s3_endpoint: str) -> dict[str, str]:
    """The AWS_* variables a user sets for the session's S3 server (tests/servers.py's aws_environment, secret key
    S3_SECRET), set in this process too (for the store's own code under test); the variables, for a run's env."""
    variables = aws_environment(s3_endpoint, S3_SECRET)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    return variables


@pytest.fixture
def bucket(aws: dict[str, str]) -> str:
    """A fresh, empty bucket on the session's S3 server: its name."""
    import s3fs

    name = f"bucket-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(
        key=aws["AWS_ACCESS_KEY_ID"],
        secret=aws["AWS_SECRET_ACCESS_KEY"],
        endpoint_url=aws["AWS_ENDPOINT_URL"],
        skip_instance_cache=True,
    ).mkdir(name)
    return name


@pytest.fixture
def proxy(aws: dict[str, str]) -> Iterator[FlakyProxy]:
    """A proxy in front of the session's S3 server that fails the requests a test tells it to."""
    with flaky_proxy(aws["AWS_ENDPOINT_URL"]) as served:
        yield served


@pytest.fixture(scope="session")
def authenticating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """A second moto server, one that checks credentials: (endpoint, an access key id it knows, that key's secret).
    Shared by the session: each test that writes to it uses a bucket of its own name."""
    with s3_server_with_user(tmp_path_factory.mktemp("s3-auth") / "moto.log") as served:
        yield served
