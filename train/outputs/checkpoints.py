"""Checkpoints: which one a run resumes from, and why the others are not used.

What the Trainer lacks: ``get_last_checkpoint()`` takes the highest-numbered directory whatever its state, so a
checkpoint cut off while being written, truncated by a full disk or damaged by another writer makes every retry
crash (a permanent crash loop under a Job controller). Here a checkpoint is resumable when its content says so:
``trainer_state.json`` parses and names the checkpoint's step (the Trainer writes it after the weights,
optimizer, scheduler and RNG states), and every weight and state file in it is whole (a safetensors file as long
as its header says; a torch zip archive whose directory reads and whose members fit in the file); every state
file transformers loads back passes the safe loader (``weights_only=True``: a planted pickle is refused, never run);
and every file is the one the ``.complete`` marker lists, with its size and SHA-256 (a flipped bit, a partial
overwrite by a second writer). A checkpoint that fails any of these is damaged: set aside, the older one used.

The marker, written once the Trainer's ``on_save`` has run, is not required: a kill between the Trainer's save and
the marker leaves a whole checkpoint without one (rotation waits for the marker: train/outputs/retention.py), and
versions before the marker wrote none; without it the content checks decide alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zipfile
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from transformers import TrainingArguments

from train.common.errors import ConfigError
from train.common.handoff import global_batch
from train.common.paths import first_link_under
from train.common.untrusted import safe_load_problem
from train.config import CheckpointArguments
from train.config.model_source import SHARDED_WEIGHTS
from train.outputs.marker import is_count, manifest_problem
from train.outputs.runfiles import (
    OPTIONS_NAME,
    TRAINER_STATE,
    RunFiles,
    aside_step,
    is_checkpoint_name,
    step_of,
)

# The key under which a checkpoint's options record holds the data's identity (train/data/identity.py).
DATA_IDENTITY = "data_identity"
# The key under which it holds the options the run set (run.json's ``options``: train/outputs/record.py recipe), which
# a branch of it starts from (train/launch/branch_options.py).
RECIPE = "recipe"
KEEP_ASIDE = 2  # the newest checkpoints moved aside are kept for a post-mortem; older ones are removed
# Options a resumed run takes from the checkpoint, whatever it is given now: the optimizer's state carries them.
KEPT_BY_RESUME = ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "optim")
# Options whose change makes a resumed run see its data in another order than an uninterrupted one would.
REORDER_DATA = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "world_size",
    "seed",
    "dataset",
    "max_seq_length",
    "padding",
    "max_train_samples",
)
TORCH_SUFFIXES = (".pt", ".pth", ".bin")


# What transformers loads back from a checkpoint with torch.load(weights_only=True): a file of these that the safe
# loader refuses would end the resume with an UnpicklingError, so it makes the checkpoint damaged here instead.
# training_args.bin is not among them: the Trainer pickles its arguments there and never loads them on resume.
SAFE_LOADED = re.compile(r"^(optimizer\.pt|scheduler\.pt|scaler\.pt|rng_state(_\d+)?\.pth|pytorch_model.*\.bin)$")


def saved_options(checkpoint: Path) -> dict[str, Any]:
    """The resolved options of the run that wrote ``checkpoint``; empty for one written before they were recorded
    (or whose record cannot be read: nothing to compare then, and the resume goes on as the options say)."""
    try:
        saved = json.loads((checkpoint / OPTIONS_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


# The saved options a resume acts on (the batch it keeps, the data it compares), each a whole number of at least 1.
ACTED_ON = ("world_size", "per_device_train_batch_size", "gradient_accumulation_steps")


def options_problem(checkpoint: Path) -> str | None:
    """Why the options record of ``checkpoint`` cannot be acted on (a field of the wrong type or range), or None."""
    if not (checkpoint / OPTIONS_NAME).exists():
        return None
    saved = saved_options(checkpoint)
    if not saved:
        return f"{OPTIONS_NAME}: not a mapping of options"
    wrong = next((k for k in ACTED_ON if k in saved and not (is_count(saved[k]) and saved[k] >= 1)), None)
    if wrong:
        return f"{OPTIONS_NAME}: {wrong} {saved[wrong]!r} is not a whole number of at least 1"
    identity = saved.get(DATA_IDENTITY, {})
    if not (isinstance(identity, dict) and all(isinstance(v, dict) for v in identity.values())):
        return f"{OPTIONS_NAME}: {DATA_IDENTITY} is not a mapping of the data's files to what identifies them"
    return None


def saved_world_size(checkpoint: Path) -> int | None:
    """The number of ranks that wrote ``checkpoint``; None when its options were not recorded."""
    try:
        return int(saved_options(checkpoint)["world_size"])
    except (KeyError, TypeError, ValueError):
        return None


def planned_steps(checkpoint: str | Path | None) -> int | None:
    """The steps the run that wrote ``checkpoint`` was to take (its trainer state's max_steps: a time budget's
    plan when it had one); None without a checkpoint or a readable state."""
    if checkpoint is None:
        return None
    try:
        steps = json.loads((Path(checkpoint) / TRAINER_STATE).read_text(encoding="utf-8"))["max_steps"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return steps if isinstance(steps, int) and steps > 0 else None


def changed_options(checkpoint: Path, options: dict[str, Any], honoured: Collection[str] = ()) -> list[str]:
    """What a resume from ``checkpoint`` will not do as ``options`` (this run's resolved options) say, in words;
    ``honoured``: options of KEPT_BY_RESUME this resume applies all the same (a branch's learning rate, which scales
    the restored schedule: train/run/branching.py)."""
    saved = saved_options(checkpoint)
    notes = []
    kept = [k for k in KEPT_BY_RESUME if k in saved and saved[k] != options.get(k) and k not in honoured]
    if kept:
        pairs = ", ".join(f"{k} {options.get(k)!r} (checkpoint: {saved[k]!r})" for k in kept)
        notes.append(f"{pairs}: the resumed optimizer keeps the checkpoint's values; MLM_RESUME=never starts over")
    reordered = [k for k in REORDER_DATA if k in saved and saved[k] != options.get(k)]
    if reordered:
        pairs = ", ".join(f"{k} {options.get(k)!r} (checkpoint: {saved[k]!r})" for k in reordered)
        notes.append(f"{pairs}: the data order differs from an uninterrupted run's")
    return notes


def kept_global_batch(
    training: TrainingArguments, sources: Mapping[str, str], checkpoint: Path
) -> tuple[int | None, str] | None:
    """A resume on another world size: the gradient accumulation that keeps the checkpoint's global batch (the
    samples per optimizer step the schedule, the learning rate and the epoch count were made for), and the line
    that says so; None when the batch is the same or this run chose its own (global_batch_size or
    gradient_accumulation_steps set: in ``sources``). The accumulation is None, and the line a warning's, when the
    checkpoint's batch is no multiple of this run's per-device batch x ranks."""
    if any(name in sources for name in ("global_batch_size", "gradient_accumulation_steps")):
        return None
    saved = saved_options(checkpoint)
    try:
        ranks, per_device = int(saved["world_size"]), int(saved["per_device_train_batch_size"])
        accumulation = int(saved["gradient_accumulation_steps"])
    except (ValueError, KeyError, TypeError):
        return None  # written before options were recorded: nothing to keep
    was = global_batch(per_device, ranks, accumulation)
    step = training.per_device_train_batch_size * training.world_size
    now = step * training.gradient_accumulation_steps
    if was == now:
        return None
    trained = f"resuming {checkpoint.name} (global batch {was} = {batch_words(ranks, per_device, accumulation)})"
    if was % step:
        return None, (
            f"{trained} on {training.world_size} rank(s) at {training.per_device_train_batch_size} per device: "
            f"{was} is no multiple of {step}, so the global batch becomes {now}; set MLM_GLOBAL_BATCH_SIZE "
            f"(a multiple of {step}) or MLM_PER_DEVICE_TRAIN_BATCH_SIZE to choose"
        )
    kept = was // step
    return kept, (
        f"{trained} on {training.world_size} rank(s): keeping its global batch, "
        f"{batch_words(training.world_size, training.per_device_train_batch_size, kept)}; "
        "MLM_GLOBAL_BATCH_SIZE sets another"
    )


def batch_words(ranks: int, per_device: int, accumulation: int) -> str:
    return f"{ranks} rank(s) x {per_device} per device x {accumulation} accumulation step(s)"


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if length < 0 or 8 + length > size:
            return f"{path.name}: truncated ({size} bytes, shorter than its header)"
        try:
            header = json.loads(handle.read(length))
        except ValueError:
            return f"{path.name}: damaged header"
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + length + end > size:
        return f"{path.name}: truncated ({size} of {8 + length + end} bytes)"
    return None


def _torch_file_problem(path: Path) -> str | None:
    """torch.save writes a zip archive: a truncated one loses the directory at its end."""
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.header_offset + info.compress_size > size:
                    return f"{path.name}: truncated"
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        return f"{path.name}: damaged ({exc})"
    return None


def problem(checkpoint: Path) -> str | None:
    """Why ``checkpoint`` cannot be resumed from, or None when it can."""
    link = first_link_under(checkpoint)
    if link is not None:  # a checkpoint is regular files: a link would read (and copy, and upload) another file
        return f"{link} is a symbolic link"
    state_file = checkpoint / TRAINER_STATE
    if not state_file.is_file():
        return f"no {TRAINER_STATE}: cut off while being written"
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return f"{TRAINER_STATE} does not parse"
    if not isinstance(state, dict) or state.get("global_step") != step_of(checkpoint):
        return f"{TRAINER_STATE} does not hold step {step_of(checkpoint)}"
    try:
        for path in sorted(checkpoint.iterdir()):
            if path.suffix == ".safetensors":
                found = _safetensors_problem(path)
            elif path.suffix in TORCH_SUFFIXES:
                found = _torch_file_problem(path)
                if found is None and SAFE_LOADED.match(path.name):
                    found = safe_load_problem(path)
            elif path.suffix == ".json":
                found = None
                try:
                    json.loads(path.read_text(encoding="utf-8"))
                except (UnicodeDecodeError, ValueError):
                    found = f"{path.name} does not parse"
            else:
                continue
            if found:
                return found
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    wrong = options_problem(checkpoint)
    if wrong:
        return wrong
    whole = any(checkpoint.glob("*.safetensors")) or any(checkpoint.glob("pytorch_model*.bin"))
    if not whole and not (checkpoint / SHARDED_WEIGHTS).is_dir():  # the marker lists each rank's shard of them
        return "no model weights"
    try:
        return manifest_problem(checkpoint)
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"


def resume_choice(checkpoint: CheckpointArguments, files: RunFiles) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(the checkpoint a run resumes from, the newer ones it skips with the reason): MLM_RESUME=auto (the newest
    resumable one), never, or an explicit path (which must be resumable). Looks only; :func:`decide_resume` acts."""
    resume = checkpoint.resume
    if resume == "never":
        return None, []
    if resume != "auto":
        path = Path(resume)
        reason = problem(path) if path.is_dir() and is_checkpoint_name(path.name) else "not a checkpoint directory"
        if reason is None and not (path / TRAINER_STATE).exists():
            reason = "not a checkpoint directory"
        if reason:
            raise ConfigError(f"{checkpoint.source_of('resume')}={resume!r}: {reason}")
        return path, []
    return newest_resumable(files)


def newest_resumable(files: RunFiles) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(the newest checkpoint in output_dir that can be resumed from, the newer ones that cannot and why)."""
    skipped: list[tuple[Path, str]] = []
    for candidate in reversed(files.checkpoints()):
        reason = problem(candidate)
        if reason is None:
            return candidate, skipped
        skipped.append((candidate, reason))
    return None, skipped


def resumed_options(resolved: Mapping[str, Any], world_size: int) -> dict[str, Any]:
    """The options a checkpoint records and a resume compares against: the resolved ones (``Config.as_dict()``,
    secrets redacted) and the world size."""
    return {**resolved, "world_size": world_size}


def decide_resume(
    checkpoint: CheckpointArguments,
    files: RunFiles,
    options: dict[str, Any],
    warn: Callable[[str], None],
    honoured: Callable[[Path], Collection[str]] = lambda chosen: (),
) -> str | None:
    """The checkpoint to resume from (:func:`resume_choice`), with the unusable newer ones moved aside; one it
    resumes from with other ``options`` (this run's: :func:`resumed_options`) than its own is said, but for those
    the resume from it applies all the same (``honoured``: :func:`changed_options`).

    Call it in one process only (world rank 0) and hand the answer to the others: on a shared volume every rank
    renaming the same directories would race.
    """
    chosen, skipped = resume_choice(checkpoint, files)

    def move(name: str) -> str:
        aside = files.aside(files.root / name, os.getpid())
        os.replace(files.root / name, aside)
        return aside.name

    set_aside([(c.name, reason) for c, reason in skipped], chosen.name if chosen else None, move, warn)
    for old in surplus_asides([p.name for p in files.asides()]):
        shutil.rmtree(files.root / old, ignore_errors=True)
    if chosen is None:
        return None
    for note in changed_options(chosen, options, honoured(chosen)):
        warn(f"resuming from {chosen.name} with changed options: {note}")
    return str(chosen)


def set_aside(
    skipped: list[tuple[str, str]], chosen: str | None, move: Callable[[str], str | None], warn: Callable[[str], None]
) -> None:
    """The one rule for the checkpoints a resume cannot use, in a directory and in a bucket (train/outputs/mirror.py):
    each is moved aside by ``move`` (which returns its new name, or None when it is gone already) and said in one
    line. Moved aside, not deleted: the Trainer would otherwise write into it again, or keep it while rotating away
    the checkpoint this run resumes from; and a person may want to look at it."""
    fallback = f"resuming from {chosen} instead" if chosen else "no resumable checkpoint left: starting over"
    for name, reason in skipped:
        aside = move(name)
        moved = f"; it was moved to {aside}" if aside else ""
        warn(f"cannot resume from {name} ({reason}); {fallback}{moved}")


def surplus_asides(names: list[str], keep: int = KEEP_ASIDE) -> list[str]:
    """The checkpoints moved aside beyond the newest ``keep`` (by step), to remove: each can be as large as the model
    and its optimizer."""
    return sorted(names, key=aside_step, reverse=True)[keep:]
