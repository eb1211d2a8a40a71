"""A run in phases: the YAML preset's ``phases:`` list, each phase a length and the options it changes.

    phases:
      - name: short-blocks        # optional; phase-1 otherwise
        steps: 600                # or tokens: 40_000_000 (positions: global batch x max_seq_length per step)
        max_seq_length: 128
        dataset: {web: 0.7, code: 0.3}
      - name: long-blocks-decay
        steps: 200
        max_seq_length: 256
        dataset: {web: 0.3, code: 0.7}
        decay: true               # warmup_stable_decay's decay is this phase's steps

Every phase trains the same run into the same output_dir, its optimizer and schedule carried over: the launcher
(train/launch/phases.py) starts each phase as a resume of the previous one's last checkpoint with the phase's
options on top of the run's, and the schedule is the whole plan's. Only the options below may change between
phases: the others (the model, the optimizer, where outputs go) are the run's.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from typing import Any

from train.common.errors import ConfigError
from train.config.bounds import shown
from train.config.yaml_file import read_yaml

PHASES_KEY = "phases"
# What a phase may change: its data and masking, its length of sequence, its batch.
PHASE_OPTIONS = (
    "dataset",
    "mixture_exhausted",
    "max_seq_length",
    "mlm_probability",
    "final_mlm_probability",
    "eval_mlm_probability",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
)
PHASE_KEYS = ("name", "steps", "tokens", "decay")


@dataclass(frozen=True)
class PhaseSpec:
    """One phase as the YAML gives it."""

    name: str
    steps: int | None  # its length in optimizer steps, or
    tokens: int | None  # in positions trained (steps = tokens / (global batch x max_seq_length), rounded up)
    decay: bool  # warmup_stable_decay's decay is (part of) this phase's steps
    options: dict[str, Any] = field(default_factory=dict)  # option: YAML value


def phases_in(path: str | None) -> list[PhaseSpec]:
    """The phases of the YAML file at ``path`` (none when it has no ``phases:``); ConfigError naming the phase and
    the key that is wrong."""
    if not path:
        return []
    raw = read_yaml(path).get(PHASES_KEY)
    if raw is None:
        return []
    where = f"{path}: {PHASES_KEY}"
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: expected a list of phases, each a mapping with steps or tokens")
    return [phase_spec(entry, f"{where}[{index}]", index) for index, entry in enumerate(raw)]


def phase_spec(entry: Any, where: str, index: int) -> PhaseSpec:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a mapping (steps or tokens, and the options the phase changes)")
    for key in entry:
        if key not in PHASE_KEYS and key not in PHASE_OPTIONS:
            near = difflib.get_close_matches(str(key), [*PHASE_KEYS, *PHASE_OPTIONS], n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            raise ConfigError(
                f"{where}: {shown(key)} cannot change between phases{hint}; a phase sets steps or tokens, name, "
                f"decay, and any of {', '.join(PHASE_OPTIONS)}"
            )
    lengths = [key for key in ("steps", "tokens") if entry.get(key) is not None]
    if len(lengths) != 1:
        raise ConfigError(f"{where}: expected its length as steps or tokens (exactly one)")
    length = entry[lengths[0]]
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise ConfigError(f"{where}: {lengths[0]}: expected a whole number of at least 1, got {shown(length)}")
    name = entry.get("name", f"phase-{index + 1}")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}: name: expected a non-empty string")
    decay = entry.get("decay", False)
    if not isinstance(decay, bool):
        raise ConfigError(f"{where}: decay: expected true or false")
    options = {key: value for key, value in entry.items() if key in PHASE_OPTIONS}
    return PhaseSpec(name, entry.get("steps"), entry.get("tokens"), decay, options)


def phase_flags(spec: PhaseSpec) -> list[str]:
    """The phase's options as command-line flags, which win over the run's own (a mixture as its JSON mapping)."""
    flags: list[str] = []
    for name, value in spec.options.items():
        flags += [f"--{name}", json.dumps(value) if isinstance(value, dict) else str(value)]
    return flags
