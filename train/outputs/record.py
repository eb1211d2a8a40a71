"""run.json: what ran (options redacted, versions, hardware, data, status), written atomically by world rank 0
whenever a run ends (finished, stopped, diverged), and every JSON file the job writes beside it."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from train.common.console import now
from train.common.distributed import is_world_zero
from train.common.errors import ConfigError
from train.common.handoff import Handoff
from train.common.versions import package_versions
from train.config import SECRET_FIELDS, Config
from train.outputs.facts import RunFacts, as_json
from train.outputs.marker import listed_files
from train.outputs.runfiles import RunFiles


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def hardware(world_size: int, handoff: Handoff | None) -> dict[str, Any]:
    """The machine, and the GPUs and precision the launcher chose for this node (unknown without a launcher)."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "world_size": world_size,
    }
    if handoff is not None:
        info.update(gpus=handoff.gpus, nnodes=handoff.nnodes, precision=handoff.precision)
    return info


NOT_IN_A_RECIPE = ("output_dir", "logging_dir", "config")


def recipe(resolved: Mapping[str, Any], sources: Mapping[str, str], handoff: Handoff | None) -> dict[str, Any]:
    """The options set for this run (``sources``' names), resolved (``Config.as_dict()``: lists and mappings as
    they are), without the launcher's decisions, the output location or secrets."""
    decided = set(handoff.decided) if handoff is not None else set()
    skipped = decided | set(NOT_IN_A_RECIPE) | set(SECRET_FIELDS)
    return {name: resolved[name] for name in sorted(sources) if name in resolved and name not in skipped}


# final/'s files that name where and when a run ran (the card its dates and output, the Trainer's pickled
# arguments its output_dir): not what a replay compares.
NOT_COMPARED = ("README.md", "training_args.bin")


def made(final: Path) -> dict[str, Any]:
    """The SHA-256 of ``final``'s files a replay compares (the model and tokenizer), as the marker lists them."""
    files = listed_files(final) or {}
    return {name: entry.get("sha256") for name, entry in sorted(files.items()) if name not in NOT_COMPARED}


@dataclass(frozen=True)
class RecordHooks:
    """What a :class:`RunRecord` calls besides writing run.json."""

    # Run once it is written (the report, and for a bucket the upload of the run's files).
    after: Sequence[Callable[[], None]] = ()
    # Entries known only as the run goes (the quality curve, the time budget's plans), asked at each write.
    live: Sequence[Callable[[], dict[str, Any]]] = ()


class RunRecord:
    """run.json, written by world rank 0 whenever the run ends, from the run's facts; ``hooks.after`` run once it
    is written. It holds the whole Config because run.json records it whole: every resolved option, and the recipe
    of those set (where each came from)."""

    def __init__(
        self,
        config: Config,
        files: RunFiles,
        facts: RunFacts,
        handoff: Handoff | None,
        started: str,
        hooks: RecordHooks = RecordHooks(),
    ) -> None:
        self.config, self.files, self.facts, self.handoff, self.started = config, files, facts, handoff, started
        self.hooks = hooks
        # run.json's sharding once every rank's bytes are measured, at the end (train/run/sharding.py's
        # sharding_facts, a collective); until then the facts' mode, choice and estimate.
        self.measured_sharding: dict[str, Any] | None = None

    def document(self, status: str) -> dict[str, Any]:
        """What run.json records: enough to tell later exactly what ran, with secrets redacted."""
        config, facts, handoff = self.config, self.facts, self.handoff
        resolved = config.as_dict(redact=True)
        world_size = config.training.world_size
        return {
            "status": status,
            "started": self.started,
            "ended": now(),
            "config": resolved,
            "versions": package_versions(),
            "world_size": world_size,
            "hardware": hardware(world_size, handoff),
            "seed": config.training.seed,
            "dataset_fingerprint": facts.dataset_fingerprint,
            # Each file read by its size, modification time and digest (train/data/identity.py); a replay compares it.
            "data_identity": facts.data_identity,
            # What changed in the data since the checkpoint this run resumed from, when it was told to go on anyway.
            "resumed_on_changed_data": facts.resumed_on_changed_data,
            # Training examples longer than max_seq_length, and the tokens truncation dropped from them.
            "truncation": facts.truncation,
            # A mixture's sources: the token share each was asked for and had, and how much of it an epoch read.
            "mixture": facts.mixture,
            # A branch's parent: the checkpoint it started from and its step (train/outputs/branch.py).
            "branch": facts.branch,
            # A phased run's phase this launch trained: its name, its steps, the plan's (train/launch/phases.py).
            "phase": facts.phase,
            # The attention implementation that ran and the head the loss went through (masked-only or dense).
            "model": as_json(facts.model),
            # The masking rates set, and the share of real tokens the first training samples had masked.
            "masking": as_json(facts.masking),
            # A global batch growing over the first steps: its first rows and its full ones (tokens where packed).
            "batch_warmup": facts.batch_warmup,
            # The padding mode, whether documents were kept apart, and real tokens per position computed.
            "packing": as_json(facts.packing),
            "image_revision": config.launch.image_revision,
            # The command the launcher ran (secrets never are in it); absent when the job was started without it.
            "command": handoff.command if handoff is not None else None,
            # The recipe `./entrypoint.sh replay` runs again: the options the user set (a preset's included), not the
            # ones the launcher decided for the machine nor where the outputs went; secrets never.
            "options": recipe(resolved, config.sources, handoff),
            # What the run made, for a replay to compare with: final/'s weights and tokenizer as its marker lists them.
            "final": made(self.files.final) if status == "finished" else None,
        }

    def write(self, status: str) -> None:
        if not is_world_zero():
            return
        document = self.document(status)
        document["sharding"] = self.measured_sharding or as_json(self.facts.sharding)
        for entries in self.hooks.live:
            document.update(entries())
        write_json_atomic(self.files.run_json, document)
        for then in self.hooks.after:
            then()


# --- run.json read back --------------------------------------------------------------------------------------------

SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class RecordedRun:
    """A finished run's run.json as a replay reads it: every field it uses, each checked for its type when read
    (a run.json is data someone else may have written; a wrong shape is one line naming the field, never a
    traceback after the replay has trained)."""

    options: dict[str, Any]  # the recipe: option name -> a scalar, a list of scalars, or a JSON mapping
    config: dict[str, Any]  # every resolved option (redacted)
    versions: dict[str, str]
    world_size: int
    dataset_fingerprint: str | None
    image_revision: str | None
    final: dict[str, str]  # final/'s file name -> SHA-256
    gpus: list[str]  # the GPUs the launcher chose (hardware.gpus), empty on CPU
    data_identity: dict[str, Any] | None = None  # each file read (train/data/identity.py); None before it was kept


def read_recorded(document: Any, name: str) -> RecordedRun:
    """``document`` (run.json as parsed) checked and typed; ConfigError naming ``name`` and the field otherwise."""

    def refuse(field: str, expected: str) -> ConfigError:
        return ConfigError(f"{name}: {field} is not {expected}")

    if not isinstance(document, dict) or "options" not in document:
        raise ConfigError(f"{name}: no recipe in it (run.json from before replay was possible)")
    if document.get("status") != "finished" or not document.get("final"):
        raise ConfigError(f"{name}: the run did not finish ({document.get('status')}): nothing to compare with")
    if document.get("phase") is not None or document.get("branch") is not None:
        what = "ran in phases" if document.get("phase") is not None else "is a branch of another run"
        raise ConfigError(
            f"{name}: the run {what}: its record holds its last launch's options only; run its plan again "
            "(the same --config, or the same branch command) into another output_dir"
        )
    options = document["options"]
    if not isinstance(options, dict) or not all(isinstance(k, str) and _option_value(v) for k, v in options.items()):
        raise refuse("options", "a mapping of option names to values (scalars, lists of scalars, mappings)")
    config = document.get("config", {})
    if not isinstance(config, dict):
        raise refuse("config", "a mapping of option names to values")
    versions, final = document.get("versions", {}), document["final"]
    if not _strings(versions):
        raise refuse("versions", "a mapping of package names to version strings")
    if not _strings(final):
        raise refuse("final", "a mapping of final/'s file names to SHA-256 digests")
    world_size = document.get("world_size")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise refuse("world_size", "a whole number of ranks, at least 1")
    for field in ("dataset_fingerprint", "image_revision"):
        if not isinstance(document.get(field), str | None):
            raise refuse(field, "a string")
    identity = document.get("data_identity")
    if not isinstance(identity, dict | None) or not all(isinstance(v, dict) for v in (identity or {}).values()):
        raise refuse("data_identity", "a mapping of the data's files to what identifies them")
    hardware = document.get("hardware") or {}
    gpus = hardware.get("gpus") if isinstance(hardware, dict) else None
    if not isinstance(gpus, list | None) or not all(isinstance(g, str) for g in gpus or []):
        raise refuse("hardware.gpus", "a list of GPU names")
    return RecordedRun(
        options=options, config=config, versions=versions, world_size=world_size,
        dataset_fingerprint=document.get("dataset_fingerprint"), image_revision=document.get("image_revision"),
        final=final, gpus=list(gpus or []), data_identity=identity,
    )  # fmt: skip


def _option_value(value: Any) -> bool:
    if isinstance(value, list):
        return all(isinstance(item, SCALARS) for item in value)
    return isinstance(value, (*SCALARS, dict))


def _strings(mapping: Any) -> bool:
    return isinstance(mapping, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items())
