"""The Hugging Face cache and offline rules, in one place: where ``HF_HOME`` and the hub cache are, where our own
cache lives inside it, whether offline mode is on, and whether a name is a local path or a hub id.

huggingface_hub computes the same answers in ``huggingface_hub.constants``, but once, at import time, from
``os.environ``; doctor and the tests ask about an environment given as a mapping, so the rules are restated here
with the library's own semantics (``XDG_CACHE_HOME``, ``HF_HUB_CACHE``, ``TRANSFORMERS_OFFLINE``, its true values).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from train.borrowed.datasets import hub_offline_lifted
from train.borrowed.transformers_integrations import kubeflow_check_answered_by
from train.common.urls import URL

# huggingface_hub.constants.ENV_VARS_TRUE_VALUES
TRUE_VALUES = {"1", "ON", "YES", "TRUE"}
# The one list of data files train.data reads: each suffix and the datasets builder that parses it, and the
# compressions datasets (and fsspec) see through by extension (zstandard: .zst). Here rather than in train.data
# because "is this name a local file or a hub id" is decided here, by the same list.
BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")
# A name ending in one of these is a local file even before it exists (corpus.jsonl.zst ends in .zst).
LOCAL_SUFFIXES = (*BUILDERS, *COMPRESSIONS)
OUR_CACHE = "mlm-trainer"
DEMO_DATASET = "demo"  # the built-in corpus: the seed's sentence repeated


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def _expand(path: str) -> Path:
    return Path(os.path.expandvars(os.path.expanduser(path)))


def hf_home(environ: Mapping[str, str] | None = None) -> Path:
    """``HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface``."""
    env = _env(environ)
    if env.get("HF_HOME"):
        return _expand(env["HF_HOME"])
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return _expand(os.path.join(base, "huggingface"))


def hub_cache(environ: Mapping[str, str] | None = None) -> Path:
    """Where downloaded models and datasets live: ``HF_HUB_CACHE`` (or the legacy name), else ``HF_HOME/hub``."""
    env = _env(environ)
    explicit = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    return _expand(explicit) if explicit else hf_home(env) / "hub"


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """Our cache folder inside HF_HOME (the one place besides output_dir the job writes to)."""
    return hf_home(environ) / OUR_CACHE


CACHE_KEY_CHARS = 20  # hex digits of a cache entry's name: 80 bits, no collision among a cache's entries


def cache_key(*parts: object) -> str:
    """The name of a cache entry made from ``parts`` (JSON-able values; anything else by its str): the same parts
    give the same name in every process and on every node."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:CACHE_KEY_CHARS]


def offline(environ: Mapping[str, str] | None = None) -> bool:
    """Offline as huggingface_hub reads it: ``HF_HUB_OFFLINE``, else ``TRANSFORMERS_OFFLINE``, set to a true value."""
    env = _env(environ)
    value = env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in TRUE_VALUES


def looks_local(name: str) -> bool:
    """A path-like name (``/``, ``.``, ``~``), a known data-file suffix, or an existing path is local; else a hub id."""
    return name.startswith(("/", ".", "~")) or Path(name).suffix.lower() in LOCAL_SUFFIXES or os.path.exists(name)


def is_hub_dataset(name: str) -> bool:
    """The one rule for what the dataset option names: a hub dataset id, unless it is the built-in demo, a URL
    (files fsspec reads: s3://, hf://, https://, file://) or a local path (:func:`looks_local`). The job's
    resolver, the launcher's hub check, doctor and the model card all ask this."""
    return name != DEMO_DATASET and not URL.match(name) and not looks_local(name)


def in_hub_cache(repo_id: str, repo_type: str, environ: Mapping[str, str] | None = None) -> bool:
    """A hub repo already downloaded: the hub cache, or (datasets) the raw-data cache train.data fills."""
    if (hub_cache(environ) / f"{repo_type}s--{repo_id.replace('/', '--')}" / "snapshots").is_dir():
        return True
    return repo_type == "dataset" and (cache_root(environ) / "raw" / repo_id.replace("/", "___")).is_dir()


def offline_hint(what: str, variable: str, environ: Mapping[str, str] | None = None) -> str:
    """Why a hub download failed, and what to do, for ``what`` (model, dataset) configured by ``variable``."""
    if offline(environ):
        return f"HF_HUB_OFFLINE is set and the {what} is not in the cache ({hf_home(environ)}); mount a local copy"
    return (
        f"the hub is unreachable or the id is unknown; with no network set HF_HUB_OFFLINE=1 and a filled cache "
        f"(HF_HOME), or mount a local copy and point {variable} at it"
    )


def kubeflow_trainer_progress(environ: Mapping[str, str] | None = None) -> bool:
    """transformers.integrations.is_kubeflow_available, restated: inside a Kubeflow Trainer v2 TrainJob
    (``KUBEFLOW_TRAINER_SERVER_URL`` set), TrainingArguments adds ``kubeflow`` to report_to, unless
    ``DISABLE_KUBEFLOW_INTEGRATION=TRUE``. tests/test_hf.py checks it answers as transformers' own does."""
    env = _env(environ)
    if env.get("DISABLE_KUBEFLOW_INTEGRATION", "FALSE").upper() == "TRUE":
        return False
    return env.get("KUBEFLOW_TRAINER_SERVER_URL") is not None


@contextlib.contextmanager
def arguments_without_models() -> Iterator[None]:
    """Build TrainingArguments without importing transformers' model code.

    TrainingArguments.__post_init__ asks ``transformers.integrations.is_kubeflow_available()``, a question about
    two environment variables, and importing it loads integration_utils and with it modeling_utils and every
    model-loading integration: 1.6 s of the launcher's 3.5 s here, in a process that never builds a model. Inside
    this block the lazy module answers with :func:`kubeflow_trainer_progress` instead (the patch:
    train/borrowed/transformers_integrations.py); where integration_utils is loaded already (a rank) nothing
    changes. The answer is the library's, read from the environment each time.
    """
    with kubeflow_check_answered_by(kubeflow_trainer_progress):
        yield


@contextlib.contextmanager
def stores_other_than_the_hub_online() -> Iterator[None]:
    """Let datasets read an object store (s3://, gs://, https://...) while HF_HUB_OFFLINE=1 says "no hub".

    datasets 4.x refuses every remote URL in offline mode ("Offline mode is enabled. Tried to reach s3://...",
    ``file_utils._raise_if_offline_mode_is_enabled``), though its streaming path reads the same files; offline
    here means the hub only. Its flag is ``datasets.config.HF_HUB_OFFLINE``, read at each request, lifted inside
    this block (the patch: train/borrowed/datasets.py)."""
    with hub_offline_lifted():
        yield
