"""What the parsed options imply, settled once when the configuration is loaded: an output_dir in a store is
trained into a local staging directory, the Hub push is the job's rather than the Trainer's, and a list of
trackers is split."""

from __future__ import annotations

import os
from collections.abc import Mapping

from train.common import hub_auth
from train.common.errors import ConfigError
from train.common.hf import cache_key, cache_root
from train.common.urls import LOCAL_PROTOCOLS, is_store_url
from train.common.urls import URL as STORE_URL
from train.config.bounds import shown
from train.config.resolved import Config
from train.config.schema import env_name

STAGING = "staging"  # the staging directories of store output_dirs, under our cache (train/common/hf.py's cache_root)


def stage_outputs(config: Config, environ: Mapping[str, str]) -> None:
    """An output_dir in a store (``s3://bucket/prefix``): the job trains into a local staging directory, which
    train/outputs/mirror.py mirrors to the store, so every module that writes output_dir writes a directory. The store's
    URL moves to ``Config.output_store``; ``training.output_dir`` becomes the staging directory (MLM_STAGING_DIR,
    else one under our cache named by the URL: the same on every node and every run of that output_dir), and
    errors about the local directory name MLM_STAGING_DIR."""
    training = config.training
    url = STORE_URL.match(training.output_dir)
    if url and url["protocol"].lower() in LOCAL_PROTOCOLS:
        training.output_dir = training.output_dir[url.end() :]  # file:///out is /out
    if not url or not is_store_url(training.output_dir):
        if url and url["protocol"].lower() not in LOCAL_PROTOCOLS:
            raise ConfigError(
                f"{config.source_of('output_dir')}={shown(training.output_dir)}: no filesystem for "
                f"{url['protocol']}://; expected a directory or a store's URL (s3://, gs://, az://, ...)"
            )
        return
    config.output_store, config.output_store_source = training.output_dir, config.source_of("output_dir")
    staging = config.outputs.staging_dir or str(cache_root(environ) / STAGING / cache_key(training.output_dir))
    training.output_dir = os.path.abspath(os.path.expanduser(staging))
    config.sources["output_dir"] = config.sources.get("staging_dir", env_name("staging_dir"))


def take_over_push(config: Config, environ: Mapping[str, str]) -> None:
    """Move MLM_PUSH_TO_HUB from the Trainer to the job, and fail now (ConfigError) when the push could not work.

    MLM_PUSH_TO_HUB, MLM_HUB_MODEL_ID and MLM_HUB_PRIVATE_REPO are TrainingArguments fields, but the Trainer's own
    push creates the repository when it is built and uploads output_dir (checkpoints, logs, training_args.bin) at
    every save. The job pushes final/ instead, once, from rank 0, after final/ and run.json are written
    (train/publish/__init__.py): the Trainer gets push_to_hub=False, Config.push_to_hub keeps the choice, and what
    the push needs is checked by train.common.hub_auth before any training rather than after it."""
    training = config.training
    config.push_to_hub, training.push_to_hub = bool(training.push_to_hub), False
    if config.push_to_hub:
        repo = f"{config.source_of('hub_model_id')}={shown(training.hub_model_id)}"
        source = config.source_of("push_to_hub")
        hub_auth.check_push(training.hub_model_id, training.hub_token, environ, source=source, repo=repo)


def split_trackers(config: Config) -> None:
    """MLM_REPORT_TO=mlflow,wandb (YAML ``report_to: mlflow,wandb``) names two trackers. TrainingArguments.report_to
    is one string to argparse, so the list arrives whole, and the Trainer would look for a tracker called
    ``mlflow,wandb``: it is split here. (The Trainer checks the names; importing its list here would cost the
    launcher seconds.)"""
    training = config.training
    names = [name.strip() for entry in training.report_to or () for name in str(entry).split(",") if name.strip()]
    training.report_to = [] if names == ["none"] else names
