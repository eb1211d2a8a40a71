"""MLM_REPORT_TO=mlflow,wandb through the front door: a real `mlflow server` on loopback and W&B in offline mode,
configured only by their own variables. Afterwards each holds the run's options, facts and final metrics (MLflow
also the final model), and no tracker credential reached a log or a file."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import tiny_env
from tests.e2e.runs import entrypoint

pytestmark = pytest.mark.slow

EXPERIMENT = "mlm-e2e"
SECRETS = {  # the trackers' credentials: sent by their clients (the server here needs none), written nowhere
    "MLFLOW_TRACKING_TOKEN": "mlflow_canary_token_0031",
    "MLFLOW_TRACKING_USERNAME": "mlm",
    "MLFLOW_TRACKING_PASSWORD": "mlflow_canary_password_0032",
    "WANDB_API_KEY": "wandb_canary_key_0033_" + "0" * 18,  # 40 characters, as W&B keys are
}
CANARIES = [value for name, value in SECRETS.items() if name != "MLFLOW_TRACKING_USERNAME"]


@dataclass
class Tracked:
    output: Path
    wandb_dir: Path
    result: subprocess.CompletedProcess
    mlflow_url: str


@pytest.fixture(scope="module")
def tracked(mlflow_server: str, tmp_path_factory: pytest.TempPathFactory) -> Tracked:
    root = tmp_path_factory.mktemp("trackers")
    output, wandb_dir = root / "out", root / "wandb"
    wandb_dir.mkdir()
    env = tiny_env(output, report_to="mlflow,wandb", image_revision="rev-trackers", logging_steps="5")
    env.update(
        MLFLOW_TRACKING_URI=mlflow_server,
        MLFLOW_EXPERIMENT_NAME=EXPERIMENT,
        WANDB_MODE="offline",
        WANDB_PROJECT=EXPERIMENT,
        WANDB_DIR=str(wandb_dir),
        WANDB_CACHE_DIR=str(root / "wandb-cache"),
        WANDB_CONFIG_DIR=str(root / "wandb-config"),
        WANDB_DATA_DIR=str(root / "wandb-data"),
        **SECRETS,
    )
    result = entrypoint(env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return Tracked(output, wandb_dir, result, mlflow_server)


def test_mlflow_holds_the_options_facts_metrics_and_final_model(tracked: Tracked, tmp_path: Path) -> None:
    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracked.mlflow_url)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None
    [run] = client.search_runs([experiment.experiment_id])
    facts = json.loads((tracked.output / "run.json").read_text())
    results = json.loads((tracked.output / "all_results.json").read_text())
    params, metrics = run.data.params, run.data.metrics
    assert run.info.status == "FINISHED"
    assert params["learning_rate"] == "0.0005" and params["n_layers"] == "2"  # the Trainer's callback
    assert params["model_name_or_path"] == "scratch:distilbert" and params["padding"] == "dynamic"  # the job's
    assert params["dataset_fingerprint"] == facts["dataset_fingerprint"] and params["image_revision"] == "rev-trackers"
    assert params["versions.torch"] == facts["versions"]["torch"] and params["train_samples"] == "320"
    assert metrics["eval_loss"] == pytest.approx(results["eval_loss"])
    assert metrics["perplexity"] == pytest.approx(results["perplexity"])
    assert metrics["train_tokens_per_second"] > 0
    assert 0 < metrics["mfu"] <= 1 and 0 <= metrics["data_wait_share"] <= 1 and metrics["packing_efficiency"] > 0

    logged = {a.path for a in client.list_artifacts(run.info.run_id, "final")}
    local = {f"final/{p.name}" for p in (tracked.output / "final").iterdir()}
    assert logged == local and "final/README.md" in logged and "final/model.safetensors" in logged
    copy = mlflow.artifacts.download_artifacts(
        run_id=run.info.run_id,
        artifact_path="final/model.safetensors",
        dst_path=str(tmp_path),
        tracking_uri=tracked.mlflow_url,
    )
    assert Path(copy).read_bytes() == (tracked.output / "final" / "model.safetensors").read_bytes()
    assert f"logged final/ to MLflow run {run.info.run_id}" in tracked.result.stderr


def wandb_records(path: Path) -> Iterator[Any]:
    """The records of an offline run file (``run-<id>.wandb``): LevelDB log format, 32 KiB blocks of chunks with
    a 7-byte header (checksum, little-endian length, type: 1 full, 2 first, 3 middle, 4 last) after a 7-byte file
    header, each record a ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_run_holds_the_config_and_summary(tracked: Tracked) -> None:
    [run_file] = tracked.wandb_dir.glob("wandb/offline-run-*/run-*.wandb")
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    kinds = set()
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        kinds.add(kind)
        updates = {"run": record.run.config.update, "config": record.config.update}.get(kind, [])
        config.update({item.key: json.loads(item.value_json) for item in updates})
        if kind == "summary":
            summary.update(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.summary.update}
            )
    facts = json.loads((tracked.output / "run.json").read_text())
    results = json.loads((tracked.output / "all_results.json").read_text())
    assert "exit" in kinds  # the run was finished, not cut off
    assert config["learning_rate"] == 0.0005 and config["n_layers"] == 2  # the Trainer's callback
    assert config["dataset_fingerprint"] == facts["dataset_fingerprint"] and config["image_revision"] == "rev-trackers"
    assert config["model_name_or_path"] == "scratch:distilbert"
    assert summary["eval/loss"] == pytest.approx(results["eval_loss"])  # the callback's last evaluation
    assert summary["perplexity"] == pytest.approx(results["perplexity"])


def test_tracker_credentials_reach_no_log_or_file(tracked: Tracked) -> None:
    from mlflow.tracking import MlflowClient

    for canary in CANARIES:
        assert canary not in tracked.result.stdout + tracked.result.stderr
    for directory in (tracked.output, tracked.wandb_dir):
        for path in directory.rglob("*"):
            if path.is_file():
                for canary in CANARIES:
                    assert canary.encode() not in path.read_bytes(), path
    client = MlflowClient(tracking_uri=tracked.mlflow_url)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None
    for run in client.search_runs([experiment.experiment_id]):
        stored = json.dumps({**run.data.params, **run.data.tags})
        assert not any(canary in stored for canary in CANARIES)


def test_stdout_stays_json_lines_with_both_trackers(tracked: Tracked) -> None:
    """A log collector reads stdout: the trackers' own notices (MLflow's run URL, W&B's offline hints) stay off it."""
    lines = tracked.result.stdout.splitlines()
    assert lines
    for line in lines:
        assert isinstance(json.loads(line), dict), line
