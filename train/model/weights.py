"""What a pretrained model's weights hold of the masked-LM model built from them, said in our words.

Continued pretraining often starts from an encoder saved without its MLM head (a sentence-transformers model, a
``BertModel``): transformers then initialises the head randomly and says so in a load report meant for fine-tuning
("MISSING ... Consider training on your downstream task", "This checkpoint seem corrupted" about the tied decoder),
with terminal colour codes even in a captured log. The rule here: the head is every tensor of the model outside its
encoder (``base_model_prefix``), less the ones tied to another (the decoder to the word embeddings); the head is
*new* when the weights hold none of it, *partly new* when they hold some. The job (train/model/load.py), doctor and
the banner say it with :func:`head_state`; the encoder's own missing tensors are a warning of their own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import try_to_load_from_cache
from transformers import AutoConfig, AutoModelForMaskedLM

from train.common.console import first_few

HEAD_NEW = "new: initialised randomly; the first evaluations measure it learning"


def _split(model: Any, keys: Iterable[str]) -> tuple[set[str], set[str]]:
    """``keys`` of ``model``'s state dict as (the encoder's, the head's), tied targets left out."""
    prefix = f"{model.base_model_prefix}."
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    keys = set(keys) - tied
    encoder = {key for key in keys if key.startswith(prefix)}
    return encoder, keys - encoder


def head_state(model: Any, missing: Iterable[str]) -> str | None:
    """``new: ...`` or ``partly new (...)`` when the weights lacked the head's tensors ``missing`` (transformers'
    loading info, or :func:`missing_by_name`); None when the head was loaded or the model has no separate head."""
    if not getattr(model, "base_model_prefix", "") or not hasattr(model, model.base_model_prefix):
        return None
    _, head = _split(model, model.state_dict().keys())
    _, lacking = _split(model, missing)
    lacking &= head
    if not head or not lacking:
        return None
    if lacking == head:
        return HEAD_NEW
    shown = first_few(sorted(lacking))
    return (
        f"partly new: {len(lacking)} of its {len(head)} tensors initialised randomly ({shown}); "
        "the first evaluations measure them learning"
    )


def encoder_missing(model: Any, missing: Iterable[str]) -> list[str]:
    """The encoder's tensors the weights lacked (initialised randomly: worth a warning, unlike a new head)."""
    encoder, _ = _split(model, missing)
    return sorted(encoder)


def stored_names(directory: Path) -> set[str] | None:
    """The tensor names of a model directory's safetensors weights (one file or an index), from their headers
    only; None when it has none."""
    index = directory / "model.safetensors.index.json"
    names: set[str] = set()
    files = sorted(directory.glob("*.safetensors"))
    try:
        if index.is_file():
            return set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}))
        for path in files:
            with path.open("rb") as handle:
                length = int.from_bytes(handle.read(8), "little")
                names.update(k for k in json.loads(handle.read(length)) if k != "__metadata__")
    except (OSError, ValueError, AttributeError):  # unreadable or not safetensors: the load will say what is wrong
        return None
    return names if files else None


def missing_by_name(model: Any, stored: set[str]) -> set[str]:
    """The model's tensors absent from ``stored`` names, a name without the encoder's prefix counting as the
    encoder's (a bare ``BertModel``'s ``embeddings.*`` is ``bert.embeddings.*``), as transformers loads them."""
    prefix = f"{model.base_model_prefix}."
    present = stored | {prefix + name for name in stored}
    return {key for key in model.state_dict() if key not in present}


def weights_directory(name: str) -> Path | None:
    """A pretrained model's files on this machine: its local directory, or its snapshot in the hub cache (never
    a request); None when neither holds a config.json."""
    local = Path(name).expanduser()
    if (local / "config.json").is_file():
        return local
    try:
        cached = try_to_load_from_cache(name, "config.json")
    except ValueError:  # not a hub id either (huggingface_hub's HFValidationError)
        return None
    return Path(cached).parent if isinstance(cached, str) else None


def head_state_before_loading(name: str) -> str | None:
    """:func:`head_state` from the names in the weights' headers and the model built on the meta device (no
    weight read, nothing allocated): what doctor says before a run. None when the files are not here, hold
    pickled weights only, or the model cannot be built from its config without its own code."""
    directory = weights_directory(name)
    stored = stored_names(directory) if directory else None
    if directory is None or stored is None:
        return None
    try:
        config = AutoConfig.from_pretrained(directory, trust_remote_code=False, local_files_only=True)
        with torch.device("meta"):
            model = AutoModelForMaskedLM.from_config(config)
    except (OSError, ValueError, KeyError):
        return None
    return head_state(model, missing_by_name(model, stored))
