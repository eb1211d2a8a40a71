"""What the trackers the Trainer reported to (``report_to``) lack: the job's options, the run's facts and the final
metrics, plus final/ as an MLflow artifact.

The Trainer's callbacks log its arguments and the model's config as parameters and every logged loss and
evaluation as metrics; they know nothing of the job's own options, of the facts run.json records (data
fingerprint, versions, image revision) or of the final metrics the job derives (perplexity, real tokens per
second). The trackers read their own credentials (``MLFLOW_TRACKING_TOKEN``, ``WANDB_API_KEY``, ...).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from train.common.console import say, warn
from train.common.errors import EnvironmentProblem
from train.common.rollbacks import rollback_words
from train.common.stragglers import straggler_words
from train.config import JOB_FIELDS
from train.publish.common import why_failed

# all_results.json entries that are counts, not measurements: trackers get them as parameters
COUNTS = ("world_size", "train_samples", "eval_samples")


def tracker_params(resolved: Mapping[str, Any], run: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    """The job's options (as run.json records them, else as ``resolved``: ``Config.as_dict()``, secrets redacted)
    and the run's facts, flat, as tracker parameters: what the Trainer's callbacks leave out (they log
    TrainingArguments and the model config)."""
    options = run.get("config") or resolved
    params: dict[str, Any] = {name: options.get(name) for name in JOB_FIELDS}
    params["push_to_hub"] = resolved["push_to_hub"]  # as asked (the Trainer's own is off: the job pushes)
    hardware = run.get("hardware") or {}
    params.update(
        dataset_fingerprint=run.get("dataset_fingerprint"),
        image_revision=run.get("image_revision"),
        precision=hardware.get("precision"),
        nnodes=hardware.get("nnodes"),
        stragglers=straggler_words(run.get("stragglers")),
        rollbacks=rollback_words(run.get("rollbacks")),
        **{name: results.get(name, run.get(name)) for name in COUNTS},
    )
    for name, version in (run.get("versions") or {}).items():
        params[f"versions.{name}"] = version
    for name, value in (run.get("truncation") or {}).items():
        params[f"truncation.{name}"] = value
    return {name: value for name, value in params.items() if value is not None}


def final_metrics(results: dict[str, Any]) -> dict[str, float]:
    """The finite measurements of all_results.json (perplexity, real tokens per second, the final evaluation)."""
    return {
        name: float(value)
        for name, value in results.items()
        if name not in COUNTS
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    }


def log_to_mlflow(final: Path, params: dict[str, Any], metrics: dict[str, float], step: int) -> None:
    """Into the run the Trainer's MLflowCallback used (ended when training ended): the parameters and final
    metrics it lacks, and final/ as the artifact directory ``final``."""
    import mlflow  # costly: loaded only when reporting to MLflow
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

    mlflow.flush_async_logging()  # the callback logs asynchronously: its parameters must be there to be compared
    run = mlflow.last_active_run()
    if run is None:
        warn("report_to mlflow: no MLflow run was started (DISABLE_MLFLOW_INTEGRATION?); final/ was not logged")
        return
    run_id, uri = run.info.run_id, mlflow.get_tracking_uri()
    client = MlflowClient()
    try:
        logged = client.get_run(run_id).data
        # A parameter cannot change once logged: the callback's (TrainingArguments, model config) stay as they are.
        fresh = [Param(k, str(v)[:MAX_PARAM_VAL_LENGTH]) for k, v in params.items() if k not in logged.params]
        for start in range(0, len(fresh), MAX_PARAMS_TAGS_PER_BATCH):
            client.log_batch(run_id, params=fresh[start : start + MAX_PARAMS_TAGS_PER_BATCH])
        stamp = int(time.time() * 1000)
        client.log_batch(run_id, metrics=[Metric(k, v, stamp, step) for k, v in metrics.items()])
        client.log_artifacts(run_id, str(final), artifact_path=final.name)
    except Exception as exc:  # noqa: BLE001 - a tracker that fails must not lose final/
        raise EnvironmentProblem(
            f"report_to mlflow: logging final/ to MLflow run {run_id} at {uri} failed ({why_failed(exc)}); the "
            f"model is kept in {final}: log it with: mlflow artifacts log-artifacts --run-id {run_id} --local-dir "
            f"{final} --artifact-path {final.name}"
        ) from exc
    say(f"logged final/ to MLflow run {run_id} ({uri})")


def log_to_wandb(params: dict[str, Any], metrics: dict[str, float]) -> None:
    """Into the run the Trainer's WandbCallback started: the options and facts into its config, the final metrics
    into its summary; then the run is finished (offline runs are complete on disk, online ones synced)."""
    import wandb  # costly: loaded only when reporting to W&B

    run = wandb.run
    if run is None:
        warn("report_to wandb: no W&B run was started (WANDB_DISABLED?); nothing more was logged")
        return
    try:
        run.config.update(params, allow_val_change=True)
        run.summary.update(metrics)
        run.finish()
    except Exception as exc:  # noqa: BLE001 - the model is safe in final/; the tracker only misses these values
        warn(f"report_to wandb: could not complete run {run.id} ({why_failed(exc)})")
