"""Whether a push to the Hugging Face hub could work, asked before any training rather than after it.

The job pushes ``final/`` once it is written (train/publish/__init__.py); everything that push needs that can be known
beforehand is checked here, from the environment huggingface_hub will read: a valid repository id, the hub online,
and a token where huggingface_hub looks for one. The configuration calls :func:`check_push` while it is resolved,
so every caller of ``load_config`` (the launcher's plan, doctor, the job) fails the same way, with exit code 2.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from train.common.errors import ConfigError
from train.common.hf import hf_home, offline

# Where huggingface_hub finds a token besides its token file, in its own order (huggingface_hub.utils._auth).
TOKEN_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# Set in a workload-identity setup, where huggingface_hub exchanges an OIDC token for a hub token itself.
OIDC_VAR = "HF_OIDC_RESOURCE"


def token_file(environ: Mapping[str, str]) -> Path:
    """huggingface_hub's token file (``hf auth login`` writes it): ``HF_TOKEN_PATH``, else ``HF_HOME/token``."""
    return Path(os.path.expanduser(environ.get("HF_TOKEN_PATH") or str(hf_home(environ) / "token")))


def has_token(given: str | None, environ: Mapping[str, str]) -> bool:
    """A token is given (the hub_token option), in the environment, obtainable through OIDC, or in the file."""
    in_environment = any(environ.get(name) for name in TOKEN_VARS) or environ.get(OIDC_VAR)
    return bool(given or in_environment or token_file(environ).is_file())


def valid_repo_id(repo_id: str) -> bool:
    """``name`` or ``namespace/name`` as the hub accepts it (huggingface_hub's own rule)."""
    # Imported here: huggingface_hub costs the launcher, which only needs it when a push is asked for.
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return False
    return True


def check_push(
    repo_id: str | None, hub_token: str | None, environ: Mapping[str, str], *, source: str, repo: str
) -> None:
    """Raise ConfigError when a push of final/ could not work: no repository id, an invalid one, offline mode, or
    no token where huggingface_hub looks for one. ``source`` names where push_to_hub was set (``MLM_PUSH_TO_HUB``),
    ``repo`` the repository id as an error shows it (``MLM_HUB_MODEL_ID='x'``)."""
    if not repo_id:
        raise ConfigError(
            f"{source}=true: set MLM_HUB_MODEL_ID to the repository to push final/ to (e.g. your-name/mlm-model)"
        )
    if not valid_repo_id(repo_id):
        raise ConfigError(f"{repo}: expected name or namespace/name, of letters, digits, '-', '_' and '.'")
    if offline(environ):
        raise ConfigError(
            f"{source}=true, but HF_HUB_OFFLINE is set: unset it (a push needs the hub), or turn {source} off"
        )
    if not has_token(hub_token, environ):
        raise ConfigError(
            f"{source}=true: no hub token; set HF_TOKEN (or HF_TOKEN_FILE, a file holding it, or HF_TOKEN_PATH, "
            f"huggingface_hub's token file, now {token_file(environ)}) to a token that can write to {repo_id}"
        )
