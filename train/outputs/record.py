"""run.json: what ran (options redacted, versions, hardware, data, status), written atomically by world rank 0
whenever a run ends (finished, stopped, diverged), and every JSON file the job writes beside it."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from train.common.console import now
from train.common.distributed import is_world_zero
from train.common.handoff import Handoff
from train.common.versions import package_versions
from train.config import SECRET_FIELDS, Config
from train.outputs.checkpoints import listed_files
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


def run_facts(
    config: Config,
    *,
    world_size: int,
    dataset_fingerprint: str,
    truncation: dict[str, int] | None = None,
    model: dict[str, Any] | None = None,
    masking: dict[str, Any] | None = None,
    packing: dict[str, Any] | None = None,
    started: str,
    status: str,
    handoff: Handoff | None,
) -> dict:
    """What run.json records: enough to tell later exactly what ran, with secrets redacted."""
    return {
        "status": status,
        "started": started,
        "ended": now(),
        "config": config.as_dict(redact=True),
        "versions": package_versions(),
        "world_size": world_size,
        "hardware": hardware(world_size, handoff),
        "seed": config.training.seed,
        "dataset_fingerprint": dataset_fingerprint,
        # Training examples longer than max_seq_length, and the tokens truncation dropped from them.
        "truncation": truncation,
        # The attention implementation that ran and the head the loss went through (masked-only or dense).
        "model": model,
        # The masking rates set, and the share of real tokens the first training samples had masked.
        "masking": masking,
        # The padding mode, whether documents were kept apart, and real tokens per position computed.
        "packing": packing,
        "image_revision": config.job.image_revision,
        # The command the launcher ran (secrets never are in it); absent when the job was started without it.
        "command": handoff.command if handoff is not None else None,
        # The recipe `./entrypoint.sh replay` runs again: the options the user set (a preset's included), not the
        # ones the launcher decided for the machine nor where the outputs went; secrets never.
        "options": recipe(config, handoff),
        # What the run made, for a replay to compare with: final/'s weights and tokenizer as its marker lists them.
        "final": made(config) if status == "finished" else None,
    }


NOT_IN_A_RECIPE = ("output_dir", "logging_dir", "config")


def recipe(config: Config, handoff: Handoff | None) -> dict[str, Any]:
    """The options set for this run, resolved (lists and mappings as they are), without the launcher's decisions,
    the output location or secrets."""
    resolved = config.as_dict(redact=True)
    decided = set(handoff.decided) if handoff is not None else set()
    skipped = decided | set(NOT_IN_A_RECIPE) | set(SECRET_FIELDS)
    return {name: resolved[name] for name in sorted(config.sources) if name in resolved and name not in skipped}


# final/'s files that name where and when a run ran (the card its dates and output, the Trainer's pickled
# arguments its output_dir): not what a replay compares.
NOT_COMPARED = ("README.md", "training_args.bin")


def made(config: Config) -> dict[str, Any]:
    """The SHA-256 of final/'s files a replay compares (the model and tokenizer), as the marker lists them."""
    files = listed_files(RunFiles(config.training.output_dir).final) or {}
    return {name: entry.get("sha256") for name, entry in sorted(files.items()) if name not in NOT_COMPARED}


class RunRecord:
    """run.json, written by world rank 0 whenever the run ends; ``after`` runs once it is written (the report,
    and for a bucket the upload of the run's files)."""

    def __init__(
        self,
        config: Config,
        files: RunFiles,
        facts: dict[str, Any],
        handoff: Handoff | None,
        started: str,
        after: Sequence[Callable[[], None]] = (),
        live: Sequence[Callable[[], dict[str, Any]]] = (),
    ) -> None:
        self.config, self.files, self.facts, self.handoff, self.started = config, files, facts, handoff, started
        self.after = list(after)
        # Entries known only as the run goes (the quality curve, the time budget's plans), asked at each write.
        self.live = list(live)

    def write(self, status: str) -> None:
        if not is_world_zero():
            return
        facts = self.facts
        document = run_facts(
            self.config,
            world_size=self.config.training.world_size,
            dataset_fingerprint=facts["dataset_fingerprint"],
            truncation=facts["truncation"],
            model={
                "attention": facts.get("attention"),
                "head": facts.get("head"),
                "head_weights": facts.get("head_weights"),
            },
            masking=facts.get("masking"),
            packing=facts.get("packing"),
            started=self.started,
            status=status,
            handoff=self.handoff,
        )
        document["sharding"] = facts.get("sharding")
        for entries in self.live:
            document.update(entries())
        write_json_atomic(self.files.run_json, document)
        for then in self.after:
            then()
