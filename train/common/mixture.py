"""What the dataset option names when it names several corpora, parsed once for every caller (the job's reader,
the launcher's hub check, doctor, the model card, the data's identity).

``MLM_DATASET=general.jsonl=0.3,domain/*.txt=0.7`` (or, in YAML, ``dataset: {general.jsonl: 0.3, domain/*.txt:
0.7}``): each source is anything the option takes alone (a file, directory or glob, a URL, a save_to_disk
directory, a hub id, the demo); the weights are shares of the training *tokens* and are normalised to sum to 1.
Sources without weights (``a.jsonl,b.jsonl``) weigh the same. How the shares are met is train/data/mixture.py's.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from train.common.errors import ConfigError

WEIGHTED = re.compile(r"^(?P<name>.+)=(?P<weight>[^=]*)$")
# What stands after a part's last "=" when it is meant as a weight, a number or a mistyped one ("abc", "0,7" split
# at its comma), rather than the end of a URL's query ("?version=latest", "&x=a/b"): no path or query character.
WEIGHT_LIKE = re.compile(r"^[^/?&:]*$")


@dataclass(frozen=True)
class Part:
    """One source of a mixture."""

    name: str  # what the dataset option would name alone
    weight: float  # its share of the training tokens, the weights normalised to sum to 1
    key: str  # its name in the logs and metrics (eval_<key>_loss): letters, digits and _


def mixture_parts(value: str, label: str) -> tuple[Part, ...] | None:
    """The sources of a mixture, in the order given; None when ``value`` names one source (as it always could:
    a name holding ``=`` or ``,`` is one source unless every part reads as ``SOURCE=WEIGHT``, the weight a word
    without a path's or query's characters). ConfigError, naming ``label``, for a mixture with a bad weight (one that
    is not a number among them) or a source named twice."""
    entries = _entries(value, label)
    if entries is None:
        return None
    names = [name for name, _ in entries]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"{label}: {twice[0]!r} is named twice; expected each source of a mixture once")
    total = sum(weight for _, weight in entries)
    keys = _keys(names)
    return tuple(Part(name, weight / total, key) for (name, weight), key in zip(entries, keys, strict=True))


def dataset_names(value: str, label: str) -> list[str]:
    """The sources the dataset option names: a mixture's, else the one."""
    parts = mixture_parts(value, label)
    return [value] if parts is None else [part.name for part in parts]


def _entries(value: str, label: str) -> list[tuple[str, float]] | None:
    if value.lstrip().startswith("{"):  # YAML's mapping, as the config layers pass it on (JSON)
        try:
            mapping = json.loads(value)
        except json.JSONDecodeError:
            return None
        if not isinstance(mapping, dict) or not mapping:
            raise ConfigError(f"{label}: expected a mapping of source: weight")
        return _checked([(str(k), _weight(v, label, str(k))) for k, v in mapping.items()], label)
    parts = [part.strip() for part in value.split(",")]
    weighted = [WEIGHTED.match(part) for part in parts]
    if len(parts) == 1:
        if weighted[0] and _number(weighted[0]["weight"]) is not None:
            raise ConfigError(f"{label}={value!r}: one source with a weight; a mixture names two or more")
        return None
    # Every part SOURCE=WEIGHT is a mixture, whatever its weights hold: a weight that is not a number is named here,
    # before anything starts, rather than read as part of a file's name that a rank then cannot find.
    if all(m is not None and WEIGHT_LIKE.match(m["weight"]) for m in weighted):
        return _checked([(m["name"].strip(), _weight(m["weight"], label, m["name"])) for m in weighted if m], label)
    if any(m is not None and _number(m["weight"]) is not None for m in weighted):
        raise ConfigError(f"{label}={value!r}: some sources have a weight and some not; expected all or none")
    if any(not part for part in parts):
        raise ConfigError(f"{label}={value!r}: an empty source between commas")
    return [(part, 1.0) for part in parts]


def _checked(entries: list[tuple[str, float]], label: str) -> list[tuple[str, float]]:
    if len(entries) < 2:
        raise ConfigError(f"{label}: a mixture names two or more sources")
    return entries


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _weight(value: object, label: str, name: str) -> float:
    number = _number(str(value)) if not isinstance(value, bool) else None
    if number is None or not math.isfinite(number) or number <= 0:
        raise ConfigError(f"{label}: the weight of {name!r} is {value!r}; expected a number above 0")
    return number


def _keys(names: list[str]) -> list[str]:
    """Short names for the logs: a file's or folder's name without its suffixes, a hub id's last part."""
    keys: list[str] = []
    for name in names:
        stem = PurePosixPath(name.rstrip("/").split("://")[-1]).name.split(".")[0]
        key = re.sub(r"[^a-z0-9]+", "_", stem.lower()).strip("_") or "source"
        keys.append(f"{key}_{len(keys) + 1}" if key in keys else key)
    return keys
