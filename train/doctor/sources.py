"""The source rows: the model, the tokenizer and the dataset are where the run will look for them. What a model name
is (scratch, local or hub) is train.config.model_source's rule; whether a name is a local path, where the caches are and
whether offline mode is on are train.common.hf's; asking the hub whether a repo exists (with a timeout) is doctor's
own."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from train.common import hf
from train.common.errors import ConfigError
from train.common.hub_reach import (
    GATED,
    NOT_FOUND,
    OFFLINE_CACHED,
    OFFLINE_MISSING,
    UNREACHABLE,
    ask_hub,
)
from train.common.mixture import dataset_names
from train.config import DataArguments, ModelArguments
from train.config.model_source import ModelSource, model_source
from train.data import is_remote, shown_url, source_files
from train.doctor.rows import FAIL, OK, WARN, Check
from train.model.load import CONVERT, unsafe_weights
from train.model.weights import head_state_before_loading


def check_hub(name: str, label: str, repo_id: str, repo_type: str, environ: Mapping[str, str]) -> Check:
    """The row of a hub repository, from train/common/hub_reach.py's one request (the launcher asks the same)."""
    answer = ask_hub(repo_id, repo_type, environ)
    state, cached = answer.state, answer.cached
    if state == OFFLINE_CACHED:
        return Check(name, OK, f"{repo_id}: offline mode, found in the cache")
    if state == OFFLINE_MISSING:
        return Check(
            name,
            FAIL,
            f"{repo_id}: offline mode (HF_HUB_OFFLINE) and not in the cache ({hf.hf_home(environ)})",
            f"fill the cache once with network access, or mount a local copy and point {label} at it",
        )
    if state == GATED:
        return Check(name, FAIL, f"{repo_id}: gated on the hub", "accept its terms on the hub, then set HF_TOKEN_FILE")
    if state == NOT_FOUND:
        return Check(
            name,
            FAIL,
            f"{repo_id}: not on the hub (or private)",
            f"check {label}; for a private repo set HF_TOKEN_FILE (or HF_TOKEN)",
        )
    if state == UNREACHABLE and cached:
        return Check(
            name,
            WARN,
            f"{repo_id}: hub unreachable ({answer.reason}); a cached copy exists",
            "set HF_HUB_OFFLINE=1 to use the cache without trying the network (a launch does so itself)",
        )
    if state == UNREACHABLE:
        return Check(
            name,
            FAIL,
            f"{repo_id}: hub unreachable ({answer.reason}) and not in the cache",
            "allow access to huggingface.co (proxy: HTTPS_PROXY), or mount a local copy, or set HF_HUB_OFFLINE=1 "
            "with a filled cache",
        )
    return Check(name, OK, f"{repo_id}: reachable on the hub" + (" (also cached)" if cached else ""))


def check_model(model: ModelArguments, environ: Mapping[str, str], field_name: str = "model_name_or_path") -> Check:
    """The model as train/config/model_source.py names it (so doctor, the job and the model card agree on what it is);
    ``field_name="tokenizer_name"`` checks the tokenizer instead."""
    if field_name != "model_name_or_path":
        return check_tokenizer(model, environ, field_name)
    label = model.source_of(field_name)
    source = model_source(model.model_name_or_path, model.config_overrides)
    if source.kind == "hub":
        return with_head_state(check_hub("model", label, source.name, "model", environ), source.name)
    if source.kind == "scratch":
        return _check_architecture(source, label)
    path = source.path or Path(source.name)  # a local source always has its path
    if path.is_dir() and (path / "config.json").exists():
        unsafe = unsafe_weights(path)  # what the job refuses before reading any data
        if unsafe:
            return Check("model", FAIL, f"{path}/{unsafe}", CONVERT)
        return with_head_state(Check("model", OK, source.description), str(path))
    return Check(
        "model",
        FAIL,
        f"{path}: no such local model directory (with a config.json)",
        f"mount the model there, or set {label} to a hub id",
    )


def with_head_state(check: Check, name: str) -> Check:
    """A pretrained model's row, saying when its weights lack the MLM head (train/model/weights.py): the job will
    initialise it randomly, which is what continued pretraining of an encoder saved without one means."""
    if check.status == FAIL:
        return check
    state = head_state_before_loading(name)
    if state:
        check.detail += f"; its MLM head is {state}"
        check.data["head_weights"] = state
    return check


def _check_architecture(source: ModelSource, label: str) -> Check:
    """A model trained from scratch: its type is one transformers knows, its config.json is readable."""
    try:
        values = source.config_values(label)
    except ConfigError as exc:
        return Check("model", FAIL, str(exc), f"point {label} at a model config.json (with a model_type)")
    from transformers import AutoConfig

    try:
        AutoConfig.for_model(values["model_type"])
    except ValueError:
        return Check(
            "model",
            FAIL,
            f"{source.name}: unknown model type {values['model_type']!r}",
            f"set {label} to e.g. scratch:distilbert",
        )
    return Check("model", OK, f"{source.description}, nothing to download")


def check_tokenizer(model: ModelArguments, environ: Mapping[str, str], field_name: str = "tokenizer_name") -> Check:
    """A tokenizer named by hub id or local directory (any directory: a tokenizer needs no config.json)."""
    name, label = getattr(model, field_name), model.source_of(field_name)
    if not hf.looks_local(name):
        return check_hub("tokenizer", label, name, "model", environ)
    path = Path(name).expanduser()
    if path.is_dir():
        return Check("tokenizer", OK, f"{path}: local directory")
    what = "not a directory" if path.exists() else "no such local tokenizer directory"
    return Check("tokenizer", FAIL, f"{path}: {what}", f"mount the tokenizer there, or set {label} to a hub id")


def check_files(name: str, label: str) -> Check:
    """A local or remote path (file, directory, glob) listed the way the job lists it (train.data.source_files):
    for a remote one that also checks the credentials and the network. A save_to_disk directory is one dataset."""
    path = Path(name).expanduser()
    if (
        not is_remote(name)
        and path.is_dir()
        and any((path / f).exists() for f in ("dataset_info.json", "dataset_dict.json"))
    ):
        if not os.access(path, os.R_OK):
            return Check("dataset", FAIL, f"{path}: not readable", "make it readable by the image's user")
        return Check("dataset", OK, f"{path}: a dataset saved with save_to_disk")
    try:
        builder, files = source_files(name, label)
    except ConfigError as exc:
        return Check("dataset", FAIL, str(exc), f"mount the data there, check the credentials, or fix {label}")
    where = "remote" if is_remote(name) else "local"
    return Check("dataset", OK, f"{shown_url(name)}: {len(files)} {where} {builder} file(s)")


def check_source(name: str, label: str, environ: Mapping[str, str]) -> Check:
    """One source the dataset option names."""
    if name == hf.DEMO_DATASET:
        return Check("dataset", OK, "demo: built in")
    if hf.is_hub_dataset(name):
        return check_hub("dataset", label, name, "dataset", environ)
    return check_files(name, label)


def check_dataset(data: DataArguments, environ: Mapping[str, str]) -> Check:
    """The dataset option's sources (each one of a mixture) and the validation file are where the run reads them."""
    label = data.source_of("dataset")
    checks = [check_source(name, label, environ) for name in dataset_names(data.dataset, label)]
    # A mixture's row: its first failing source's, else each source's words in one row.
    result = next((check for check in checks if check.status != OK), None) or (
        checks[0] if len(checks) == 1 else Check("dataset", OK, "mixture: " + "; ".join(c.detail for c in checks))
    )
    validation = data.validation_file
    if validation and not Path(validation).expanduser().exists():
        return Check(
            "dataset",
            FAIL,
            f"validation_file {validation}: no such file",
            f"mount it or fix {data.source_of('validation_file')}",
        )
    return result
