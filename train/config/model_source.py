"""What a model name is, decided once: the job builds from it (train/model/load.py), doctor checks it
(train/doctor/sources.py), the model card describes it (train/publish/card.py) and the configuration picks its
recipe by it (train/config/recipes.py: from scratch or pretrained), so none of them can disagree. It sits in
config/ because the configuration is the lowest of those four (it reads names and paths, never a model).

``model_name_or_path`` is one of:

- ``scratch:<model_type>``: a new architecture of that type, no weights (``config_overrides`` shape it);
- a local ``.json`` file, or a local directory holding a ``config.json`` and no weights: that architecture, built
  from scratch (``config_overrides`` apply too);
- any other local path: a pretrained model in a directory (it may be missing, or be a sharded checkpoint, which is
  not a model: the loader and doctor say so);
- anything else: a hub id.

Whether a name is local is :func:`train.common.hf.looks_local` (``/``, ``.``, ``~``, a data-file suffix, or an
existing path), the rule the datasets and doctor use as well. ``config_overrides`` only shape an architecture built
from scratch; a pretrained model's config is its own, and the description says the overrides are ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from train.common.errors import ConfigError
from train.common.hf import looks_local

SCRATCH_PREFIX = "scratch:"
# A directory holding one of these is a pretrained model; with only a config.json it is an architecture.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)

# A checkpoint written under MLM_SHARDING=fsdp holds its weights as each rank's shard in this directory
# (train/run/sharding.py), beside a config.json: weights, but not a model transformers loads.
SHARDED_WEIGHTS = "model_dcp"

Kind = Literal["scratch", "local", "hub"]


@dataclass(frozen=True)
class ModelSource:
    """Where the model comes from: ``kind`` (scratch, local or hub), the name as the option gave it, and for
    scratch either the ``model_type`` or the ``config_file`` its architecture is read from; ``path`` is the
    expanded local path (None for a hub id or ``scratch:<type>``)."""

    kind: Kind
    name: str
    path: Path | None = None
    model_type: str | None = None
    config_file: Path | None = None
    overrides: str | None = None

    @property
    def pretrained(self) -> bool:
        """Weights are loaded (from a directory or the hub) rather than initialized."""
        return self.kind != "scratch"

    @property
    def description(self) -> str:
        """One line for a person: the name, the overrides that shape it, and whether it is trained from scratch."""
        if self.kind == "scratch":
            shaped = f"{self.name} ({self.overrides})" if self.overrides else self.name
            only_config = " (config.json only, no weights)" if self.config_file not in (None, self.path) else ""
            return f"{shaped}{only_config}, trained from scratch"
        where = "in a local directory" if self.kind == "local" else "on the hub"
        ignored = "; config_overrides ignored (they shape a model trained from scratch)" if self.overrides else ""
        return f"{self.name}, from its pretrained weights {where}{ignored}"

    def config_values(self, label: str) -> dict[str, Any]:
        """The constructor arguments of a scratch architecture (before overrides): ``{"model_type": ...}`` or
        the config.json's contents. ``label`` is the option that named the model, for the error."""
        if self.model_type is not None:
            return {"model_type": self.model_type}
        if self.config_file is None:
            raise ValueError(f"{self.name!r} is a pretrained model, not an architecture")
        return read_config_json(self.config_file, label)


def model_source(name: str, config_overrides: str | None = None) -> ModelSource:
    """The one rule (see the module's docstring): ``name`` is ``model_name_or_path``."""
    overrides = config_overrides or None
    if name.startswith(SCRATCH_PREFIX):
        return ModelSource("scratch", name, model_type=name[len(SCRATCH_PREFIX) :], overrides=overrides)
    if not looks_local(name):
        return ModelSource("hub", name, overrides=overrides)
    path = Path(name).expanduser()
    config_file = architecture_file(path)
    if config_file is not None:
        return ModelSource("scratch", name, path=path, config_file=config_file, overrides=overrides)
    return ModelSource("local", name, path=path, overrides=overrides)


def architecture_file(path: Path) -> Path | None:
    """The config.json a local path builds from scratch: the path itself when it is a ``.json`` file, its
    config.json when it is a directory without weights; None for a model with weights or a missing path."""
    if path.is_file() and path.suffix == ".json":
        return path
    holds_weights = any((path / name).exists() for name in (*WEIGHT_FILES, SHARDED_WEIGHTS))
    if path.is_dir() and (path / "config.json").is_file() and not holds_weights:
        return path / "config.json"
    return None


def read_config_json(path: Path, label: str) -> dict[str, Any]:
    """A model config.json's values; a ConfigError naming ``label`` when it is unreadable or has no model_type."""
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{label}={str(path)!r}: not a model config.json ({exc})") from None
    if not isinstance(values, dict) or "model_type" not in values:
        raise ConfigError(f"{label}={str(path)!r}: not a model config.json (no model_type)")
    return values
