"""Whether a hub repository can be had: asked once, with a timeout, by doctor's source rows and by the launcher
before any process starts.

huggingface_hub retries a failed request with back-off: a run whose model is on an unreachable hub spent 53 s in
12 tries before its error, after the launcher, torchrun and the rank had started and read the data. One request
with a timeout answers the same question in seconds; nothing in huggingface_hub asks it without retrying.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from train.common import hf

HUB_TIMEOUT_S = 10.0

REACHABLE = "reachable"
OFFLINE_CACHED = "offline, cached"
OFFLINE_MISSING = "offline, not cached"
GATED = "gated"
NOT_FOUND = "not found"
UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class HubAnswer:
    """What the hub (or the cache, offline) says of one repository."""

    repo_id: str
    state: str  # one of the constants above
    cached: bool
    reason: str = ""  # an unreachable hub's error, in one line


def hub_info(repo_id: str, repo_type: str, timeout: float) -> None:
    """Ask the hub about a repo (raises on any failure). Separate so tests replace it."""
    import huggingface_hub

    if repo_type == "model":
        huggingface_hub.model_info(repo_id, timeout=timeout)
    else:
        huggingface_hub.dataset_info(repo_id, timeout=timeout)


def ask_hub(repo_id: str, repo_type: str, environ: Mapping[str, str] | None = None) -> HubAnswer:
    """One request (none in offline mode, where the cache answers)."""
    cached = hf.in_hub_cache(repo_id, repo_type, environ)
    if hf.offline(environ):
        return HubAnswer(repo_id, OFFLINE_CACHED if cached else OFFLINE_MISSING, cached)
    try:
        hub_info(repo_id, repo_type, HUB_TIMEOUT_S)
    except Exception as exc:
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

        if isinstance(exc, GatedRepoError):  # a subclass of RepositoryNotFoundError: first
            return HubAnswer(repo_id, GATED, cached)
        if isinstance(exc, RepositoryNotFoundError):
            return HubAnswer(repo_id, NOT_FOUND, cached)
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        return HubAnswer(repo_id, UNREACHABLE, cached, reason)
    return HubAnswer(repo_id, REACHABLE, cached)
