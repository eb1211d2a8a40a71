"""The hub asked once before any process starts: a run whose model, tokenizer or dataset is a hub repository learns
in seconds that the hub cannot give it, instead of after torchrun, the rank's imports, the data and
huggingface_hub's retries (53 s in 12 tries, then the same error). The question is train/common/hub_reach.py's, the
one doctor's source rows ask.

- A repository that does not exist, or is gated: exit 2, naming the option.
- The hub unreachable and a repository not in the cache: exit 3 (the machine's network), with what to do.
- The hub unreachable and every repository cached: the run goes on offline (``HF_HUB_OFFLINE=1`` for its
  processes), said in one line; huggingface_hub would reach the cache too, after its retries.
- Offline mode already set: nothing is asked (the cache answers, as the job's own loading says).
"""

from __future__ import annotations

from collections.abc import Mapping

from train.common import hf
from train.common.errors import ConfigError, EnvironmentProblem
from train.common.hub_reach import GATED, NOT_FOUND, UNREACHABLE, HubAnswer, ask_hub
from train.common.mixture import dataset_names
from train.common.urls import is_store_url
from train.config import DataArguments, ModelArguments
from train.config.model_source import model_source


def hub_repositories(model: ModelArguments, data: DataArguments) -> list[tuple[str, str, str]]:
    """(the option that names it, repo id, repo type) of each hub repository the run reads: the model, the
    tokenizer, the dataset's sources."""
    found = []
    source = model_source(model.model_name_or_path, model.config_overrides)
    if source.kind == "hub":
        found.append((model.source_of("model_name_or_path"), source.name, "model"))
    tokenizer = model.tokenizer_name
    if tokenizer and not hf.looks_local(tokenizer) and not is_store_url(tokenizer):
        found.append((model.source_of("tokenizer_name"), tokenizer, "model"))
    for name in dataset_names(data.dataset, data.source_of("dataset")):
        if hf.is_hub_dataset(name):
            found.append((data.source_of("dataset"), name, "dataset"))
    return found


def reach_the_hub(
    model: ModelArguments, data: DataArguments, environ: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """The environment the run's processes get (offline where the hub is unreachable and all is cached) and the
    lines to say; ConfigError or EnvironmentProblem where the hub cannot give the run what it reads."""
    repositories = hub_repositories(model, data)
    if hf.offline(environ) or not repositories:
        return dict(environ), []
    answers = [(label, ask_hub(repo_id, kind, environ)) for label, repo_id, kind in repositories]
    for label, answer in answers:
        _refuse(label, answer, environ)
    unreachable = [answer for _, answer in answers if answer.state == UNREACHABLE]
    if not unreachable:
        return dict(environ), []
    names = ", ".join(answer.repo_id for _, answer in answers)
    line = (
        f"the hub is unreachable ({unreachable[0].reason}); {names} in the cache ({hf.hf_home(environ)}): this run "
        "reads it there (HF_HUB_OFFLINE=1 for its processes)"
    )
    return {**environ, "HF_HUB_OFFLINE": "1"}, [line]


def _refuse(label: str, answer: HubAnswer, environ: Mapping[str, str]) -> None:
    if answer.state == NOT_FOUND:
        raise ConfigError(f"{label}={answer.repo_id!r}: not on the hub (or private: set HF_TOKEN_FILE or HF_TOKEN)")
    if answer.state == GATED:
        raise ConfigError(
            f"{label}={answer.repo_id!r}: gated on the hub: accept its terms there, then set HF_TOKEN_FILE"
        )
    if answer.state == UNREACHABLE and not answer.cached:
        raise EnvironmentProblem(
            f"{label}={answer.repo_id!r}: the hub is unreachable ({answer.reason}) and it is not in the cache "
            f"({hf.hf_home(environ)}): allow access to the hub (proxy: HTTPS_PROXY), mount a local copy and point "
            f"{label} at it, or set HF_HUB_OFFLINE=1 with a filled cache"
        )
