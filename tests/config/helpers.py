"""What the config tests share: a YAML layer in a temporary file, and an option read off a resolved Config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from train.config import Config

REPO = Path(__file__).resolve().parents[2]


def write_yaml(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def value_of(config: Config, name: str) -> Any:
    """An option's resolved value, wherever in the schema it is (job or TrainingArguments)."""
    return config.option(name)
