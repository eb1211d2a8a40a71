"""What leaves the machine after a run: final/ pushed to the hub with a model card, and, for the trackers the
Trainer reported to (``report_to``), the run's options, facts and final metrics, plus the final model as an MLflow
artifact.

The Trainer's callbacks log to MLflow and W&B while training: its arguments and the model's config as parameters,
every logged loss and evaluation as metrics. They know nothing of the job's own options, of the facts ``run.json``
records (data fingerprint, versions, image revision) or of the final metrics the job derives (perplexity, real tokens
per second); :func:`publish_run` adds those. It runs on world rank 0 only, once final/, ``all_results.json`` and
``run.json`` are written, so every fact it reports is one the output directory already holds.

A push or artifact that fails is an :class:`~train.common.errors.EnvironmentProblem` (exit 3) naming what failed and
how to send the model by hand: final/ stays as it is. Secrets never pass through here: the hub token is read by
huggingface_hub from ``HF_TOKEN`` / ``HF_TOKEN_PATH`` (the config moves the option there: move_hub_token_to_env),
the trackers' from their own variables (``MLFLOW_TRACKING_TOKEN``, ``WANDB_API_KEY``, ...).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from train.common.console import say, warn
from train.common.errors import EnvironmentProblem, first_line
from train.config import SECRET_FIELDS, Config, JobArguments
from train.outputs.runfiles import RunFiles

CARD = "README.md"
# all_results.json entries that are counts, not measurements: trackers get them as parameters
COUNTS = ("world_size", "train_samples", "eval_samples")
CARD_TAGS = ["fill-mask", "masked-lm", "mlm-trainer"]


def publish_run(config: Config, files: RunFiles, step: int) -> None:
    """Push final/ (MLM_PUSH_TO_HUB) and complete the tracker runs; call on world rank 0 after run.json is written.

    Each destination is tried even when another failed; the failures are then raised together as one line."""
    final = files.final
    run = _read_json(files.run_json)
    results = _read_json(files.all_results)
    trackers = set(config.training.report_to or ())
    problems: list[str] = []
    if config.push_to_hub:
        try:
            push_final(config, final, run, results, step)
        except EnvironmentProblem as exc:
            problems.append(str(exc))
    if "mlflow" in trackers:
        if not (final / CARD).exists():
            write_card(final, model_card(config, run, results, step, repo_id=None, mask=mask_token(final)))
        try:
            log_to_mlflow(final, tracker_params(config, run, results), final_metrics(results), step)
        except EnvironmentProblem as exc:
            problems.append(str(exc))
    if "wandb" in trackers:
        log_to_wandb(tracker_params(config, run, results), final_metrics(results))
    if problems:
        raise EnvironmentProblem("; ".join(problems))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


# ---- what is reported ------------------------------------------------------------------------------------------


def tracker_params(config: Config, run: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    """The job's options (as run.json records them: secrets redacted) and the run's facts, flat, as tracker
    parameters: what the Trainer's callbacks leave out (they log TrainingArguments and the model config)."""
    options = run.get("config") or config.as_dict(redact=True)
    params: dict[str, Any] = {name: options.get(name) for name in JobArguments.__dataclass_fields__}
    params["push_to_hub"] = config.push_to_hub
    hardware = run.get("hardware") or {}
    params.update(
        dataset_fingerprint=run.get("dataset_fingerprint"),
        image_revision=run.get("image_revision"),
        precision=hardware.get("precision"),
        nnodes=hardware.get("nnodes"),
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


def model_card(
    config: Config,
    run: dict[str, Any],
    results: dict[str, Any],
    step: int,
    repo_id: str | None,
    mask: str = "[MASK]",
) -> str:
    """README.md for final/: hub metadata, the results, the data and how the model was trained, how to use it."""
    from huggingface_hub import ModelCardData

    from train.common.hf import looks_local

    job, options = config.job, run.get("config") or config.as_dict(redact=True)
    model = job.model_name_or_path
    from_hub_model = not model.startswith("scratch:") and not model.endswith(".json") and not looks_local(model)
    hub_dataset = job.dataset != "demo" and not looks_local(job.dataset) and "://" not in job.dataset
    metadata = ModelCardData(
        library_name="transformers",
        pipeline_tag="fill-mask",
        tags=CARD_TAGS,
        base_model=model if from_hub_model else None,
        datasets=[job.dataset] if hub_dataset else None,
    ).to_yaml()
    name = (repo_id or config.training.hub_model_id or "mlm-trainer model").split("/")[-1]
    hardware = run.get("hardware") or {}
    versions = run.get("versions") or {}
    world = run.get("world_size") or results.get("world_size")
    batch = "?"
    if world:
        batch = str(
            int(options.get("per_device_train_batch_size") or 0)
            * int(world)
            * int(options.get("gradient_accumulation_steps") or 1)
        )
    arch = f"{model} ({job.config_overrides})" if job.config_overrides else model
    if model.startswith("scratch:") or model.endswith(".json"):
        arch += ", trained from scratch"
    rows_results = [
        ("evaluation loss", _number(results.get("eval_loss"), ".4f")),
        ("perplexity", _number(results.get("perplexity"), ".2f")),
        ("masked-token accuracy", _number(results.get("eval_accuracy"), ".4f")),
        ("optimizer steps", f"{step:,} (global batch {batch} samples)"),
        ("real tokens / s", _number(results.get("train_tokens_per_second"), ",.0f")),
    ]
    samples = f"{_count(results.get('train_samples'))} train / {_count(results.get('eval_samples'))} evaluation"
    rows_data = [
        ("dataset", f"`{job.dataset}`" + (f" (config `{job.dataset_config_name}`)" if job.dataset_config_name else "")),
        ("fingerprint", f"`{run.get('dataset_fingerprint') or 'unknown'}`"),
        ("samples", samples),
        ("sequence length", f"{job.max_seq_length} tokens, padding `{job.padding}`, masking {job.mlm_probability:g}"),
    ]
    rows_training = [
        ("model", f"`{arch}`"),
        ("world size", f"{world or '?'} process(es), precision {hardware.get('precision') or 'as configured'}"),
        ("versions", " · ".join(f"{k} {v}" for k, v in versions.items()) or "unknown"),
        ("image revision", f"`{run.get('image_revision') or 'unknown'}`"),
        ("started / ended", f"{run.get('started', '?')} / {run.get('ended', '?')}"),
    ]
    chosen = {key: options.get(key) for key in sorted(config.sources) if key in options and key not in SECRET_FIELDS}
    where = repo_id or "path/to/final"
    lines = [
        "---",
        metadata.rstrip(),
        "---",
        "",
        f"# {name}",
        "",
        f"A masked language model trained with mlm-trainer (a Hugging Face `Trainer` under `torchrun`): `{arch}`.",
        "",
        "## Results",
        "",
        *_table(rows_results),
        "",
        "## Training data",
        "",
        *_table(rows_data),
        "",
        "## How it was trained",
        "",
        *_table(rows_training),
        "",
        "## Use",
        "",
        "```python",
        "from transformers import pipeline",
        "",
        f'fill_mask = pipeline("fill-mask", model="{where}")',
        f'fill_mask("This is a training {mask} for multi-GPU demonstration.")',
        "```",
        "",
        "## Options set for this run",
        "",
        "Everything else has its default; the run's full record is `run.json` in its output directory.",
        "",
        "```json",
        json.dumps(chosen, indent=2, sort_keys=True, default=str),
        "```",
        "",
    ]
    return "\n".join(lines)


def _table(rows: list[tuple[str, str]]) -> list[str]:
    return ["| | |", "|---|---|", *(f"| {key} | {value} |" for key, value in rows)]


def _number(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else "not measured"


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"


def mask_token(final: Path) -> str:
    """The tokenizer's mask token as final/ saved it (``[MASK]`` for BERT-like tokenizers)."""
    mask = _read_json(final / "tokenizer_config.json").get("mask_token")
    if isinstance(mask, dict):  # an AddedToken, serialized
        mask = mask.get("content")
    return mask if isinstance(mask, str) and mask else "[MASK]"


def write_card(final: Path, text: str) -> None:
    """final/README.md, replaced in one step (final/ stays whole at every moment)."""
    tmp = final / f".{CARD}.tmp-{os.getpid()}"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, final / CARD)


# ---- destinations ------------------------------------------------------------------------------------------------


def _why(exc: BaseException) -> str:
    """One line on why a request failed: the HTTP status and the server's message, or the error's first line."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if status is not None:
        reason = getattr(response, "reason_phrase", "") or ""
        said = (getattr(exc, "server_message", None) or "").strip().splitlines()
        return f"{status} {reason}".strip() + (f": {said[0][:200]}" if said else "")
    first = first_line(exc)
    return type(exc).__name__ if first == type(exc).__name__ else f"{type(exc).__name__}: {first}"


def push_final(config: Config, final: Path, run: dict[str, Any], results: dict[str, Any], step: int) -> str:
    """Create the repository if needed (``hub_private_repo`` applies to a new one), write the model card into
    final/ and upload final/ as one commit; the repository's URL. HF_ENDPOINT and the token are huggingface_hub's."""
    from huggingface_hub import HfApi

    training = config.training
    source = config.source_of("push_to_hub")
    repo_id = str(training.hub_model_id)
    api = HfApi()
    try:
        repo = api.create_repo(repo_id, private=training.hub_private_repo, exist_ok=True)
        repo_id = repo.repo_id
        write_card(final, model_card(config, run, results, step, repo_id=repo_id, mask=mask_token(final)))
        loss = results.get("eval_loss")
        summary = f"mlm-trainer: final model after {step:,} steps" + (
            f", eval loss {loss:.4f}" if isinstance(loss, float) else ""
        )
        revision = run.get("image_revision") or "unknown"
        api.upload_folder(
            repo_id=repo_id,
            folder_path=final,
            commit_message=summary,
            commit_description=f"Image revision {revision}; dataset fingerprint {run.get('dataset_fingerprint')}.",
        )
    except Exception as exc:  # noqa: BLE001 - whatever failed (HTTP, network, the card's metadata), final/ is kept
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403):
            fix = f"check that the token (HF_TOKEN, HF_TOKEN_FILE or HF_TOKEN_PATH) may write to {repo_id}"
        elif status == 404:
            fix = (
                f"check {config.source_of('hub_model_id')} ({repo_id}) and that the token may create repositories there"
            )
        else:
            fix = "the hub or the network failed (HF_ENDPOINT names the hub); try again later"
        private = " --private" if training.hub_private_repo else ""
        raise EnvironmentProblem(
            f"{source}=true: pushing final/ to {repo_id} at {api.endpoint} failed ({_why(exc)}); the model is kept "
            f"in {final}: {fix}, then push it with: hf upload {repo_id} {final}{private}"
        ) from exc
    say(f"pushed final/ to {repo}")
    return str(repo)


def log_to_mlflow(final: Path, params: dict[str, Any], metrics: dict[str, float], step: int) -> None:
    """Into the run the Trainer's MLflowCallback used (ended when training ended): the parameters and final
    metrics it lacks, and final/ as the artifact directory ``final``."""
    import mlflow
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
            f"report_to mlflow: logging final/ to MLflow run {run_id} at {uri} failed ({_why(exc)}); the model is "
            f"kept in {final}: log it with: mlflow artifacts log-artifacts --run-id {run_id} --local-dir {final} "
            f"--artifact-path {final.name}"
        ) from exc
    say(f"logged final/ to MLflow run {run_id} ({uri})")


def log_to_wandb(params: dict[str, Any], metrics: dict[str, float]) -> None:
    """Into the run the Trainer's WandbCallback started: the options and facts into its config, the final metrics
    into its summary; then the run is finished (offline runs are complete on disk, online ones synced)."""
    import wandb

    run = wandb.run
    if run is None:
        warn("report_to wandb: no W&B run was started (WANDB_DISABLED?); nothing more was logged")
        return
    try:
        run.config.update(params, allow_val_change=True)
        run.summary.update(metrics)
        run.finish()
    except Exception as exc:  # noqa: BLE001 - the model is safe in final/; the tracker only misses these values
        warn(f"report_to wandb: could not complete run {run.id} ({_why(exc)})")
