"""The completeness marker (``.complete``) of a checkpoint or of final/: written once every rank's files are, it lists
each file with its size and SHA-256, so that a resume, ``verify`` and a replay can tell the files are the ones
written. Which rank wrote which file of a checkpoint is decided here too: each rank digests its own.

A marker is data when read back (whoever can write a shared volume can rewrite it): each listed name must be a file
inside its directory, reached without a link (train/common/paths.py), each entry a size and a digest."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

from train.common.console import now
from train.common.paths import inside
from train.outputs.runfiles import COMPLETE_MARKER, OPTIONS_NAME

# The Trainer's RNG state: rng_state.pth with one process, rng_state_<process index>.pth with several; each rank
# writes its own (transformers 5.25, Trainer._save_rng_state), every other file of a checkpoint is world rank 0's.
RNG_STATE = re.compile(r"^rng_state(?:_(\d+))?\.pth$")
# A sharded optimizer (MLM_SHARDING=fsdp, train/run/sharding.py): torch.distributed.checkpoint writes each rank's
# shard as __<rank>_0.distcp; its .metadata and .metadata.pt are the coordinator's (world rank 0).
DCP_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")


def writer_of(name: PurePosixPath | Path) -> int:
    """The world rank that wrote a checkpoint's file ``name``."""
    base = PurePosixPath(name).name
    match = RNG_STATE.match(base) or DCP_SHARD.match(base)
    return int(match[1]) if match and match[1] else 0


def digest(path: Path) -> dict[str, Any]:
    """A file's size and SHA-256, as the completeness marker lists them."""
    with path.open("rb") as handle:
        return {"size": path.stat().st_size, "sha256": hashlib.file_digest(handle, "sha256").hexdigest()}


def digests_written_by(checkpoint: Path, rank: int) -> dict[str, dict[str, Any]]:
    """The size and digest of each file of ``checkpoint`` world rank ``rank`` wrote (the marker aside)."""
    found = {}
    for path in sorted(p for p in checkpoint.rglob("*") if listed(p)):
        rel = path.relative_to(checkpoint)
        if writer_of(rel) == rank:
            found[rel.as_posix()] = digest(path)
    return found


def mark_complete(
    checkpoint: Path, options: dict[str, Any] | None = None, others: dict[str, dict[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """World rank 0, once every rank's files are written: the options of the run that wrote the checkpoint, then
    the marker listing every file with its size and SHA-256 (``others``: the other ranks' own files, digested by
    them: on a node-local staging directory rank 0 does not see them). Returns what the marker lists."""
    if options is not None:
        (checkpoint / OPTIONS_NAME).write_text(json.dumps(options, indent=1, default=str), encoding="utf-8")
    return write_marker(checkpoint, {**digests_written_by(checkpoint, 0), **(others or {})})


def write_marker(directory: Path, files: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """The completeness marker of a checkpoint or of final/: when, and every file with its size and SHA-256
    (``files``; None: every file of ``directory``, digested here)."""
    if files is None:
        files = {p.relative_to(directory).as_posix(): digest(p) for p in sorted(directory.rglob("*")) if listed(p)}
    listed_files = dict(sorted(files.items()))
    marker = {"completed": now(), "files": listed_files}
    (directory / COMPLETE_MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
    return listed_files


def listed(path: Path) -> bool:
    """Whether the marker lists ``path``: every file but the marker itself."""
    return path.is_file() and path.name != COMPLETE_MARKER


def listed_files(directory: Path) -> dict[str, dict[str, Any]] | None:
    """The files the marker lists, or None: no marker, or one written before markers listed files."""
    try:
        found = json.loads((directory / COMPLETE_MARKER).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return found if isinstance(found, dict) else None


def weights_digest(directory: Path) -> str | None:
    """``name sha256:<hex>`` of the model's weights as the marker lists them (the model card names it), or None."""
    files = listed_files(directory) or {}
    weights = sorted(name for name in files if name.endswith(".safetensors") or name.startswith("pytorch_model"))
    if not weights:
        return None
    return ", ".join(f"{name} sha256:{files[name].get('sha256')}" for name in weights)


def manifest_problem(directory: Path, added_later: tuple[str, ...] = ()) -> str | None:
    """Whether the files are the ones the marker lists (none missing, none extra but ``added_later``, each size and
    SHA-256 the same). No list to compare with: None (the content checks stay)."""
    listed_now = listed_files(directory)
    if listed_now is None:
        return None
    for name, entry in listed_now.items():  # a marker is data: a name leading out, or a link, makes it unusable
        wrong = inside(directory, name)
        if wrong:
            return f"{wrong} (listed by the marker)"
        if not (isinstance(entry, dict) and is_count(entry.get("size")) and isinstance(entry.get("sha256"), str)):
            return f"{COMPLETE_MARKER}: {name}: {entry!r} is not a size and a SHA-256"
    present = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if listed(p)} - set(added_later)
    missing, extra = sorted(set(listed_now) - present), sorted(present - set(listed_now))
    if missing:
        return f"{missing[0]}: missing (the marker lists it)"
    if extra:
        return f"{extra[0]}: not among the files the marker lists"
    for name, expected in listed_now.items():
        found = digest(directory / name)
        if found["size"] != expected.get("size"):
            return f"{name}: {found['size']} bytes, the marker says {expected.get('size')}"
        if found["sha256"] != expected.get("sha256"):
            return f"{name}: its SHA-256 differs from the marker's (the bytes changed after it was written)"
    return None


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
