"""The data's identity: what a run read, as each checkpoint and run.json record it, and what changed between two
records in words. A resume (and a replay) compares the record with the data it is about to read, so a corpus
replaced in place between a stop and its resume is said, not silently mixed into one model.

What the libraries lack: datasets' fingerprints name a cache entry, not data a person would recognise, and a
stream's names only its files (nothing is read before training). So each file is recorded by its size, its
modification time and a SHA-256: of the whole file while the source's files total at most ``WHOLE_DIGEST_BYTES``
(cheap: well under a second), else of ``SAMPLE_BYTES`` at its start, middle and end. A remote file is recorded by
its size and the version its store gives (an S3 ETag, a modification time); nothing is read. A hub dataset is
recorded by the fingerprint of what was loaded (it moves with the dataset's revision), the demo by its size.

What counts as a change: another size or digest, a file added or gone. A modification time alone does not (a
corpus copied to a fresh machine keeps its content); for a sampled file it is said as a note, since an edit
between the samples would not show in the digest.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from train.config import DataArguments
from train.data.sources import DEMO, is_remote, resolve, resolve_files, shown_url

WHOLE_DIGEST_BYTES = 256 * 2**20
SAMPLE_BYTES = 2**20
Identity = dict[str, dict[str, Any]]  # the record: a file's (or source's) name -> what identifies its content


def data_identity(data: DataArguments, fingerprint: str) -> Identity:
    """What identifies the data this run reads now (the dataset, and the validation file when one is set);
    ``fingerprint``: the loaded data's, which stands for a hub dataset."""
    source = resolve(data.dataset, data.source_of("dataset"), data.dataset_config_name)
    if source.name == DEMO:
        identity: Identity = {"demo": {"samples": data.demo_samples}}
    elif source.kind == "hub":
        identity = {f"hub:{source.name}": {"config": source.config_name, "fingerprint": fingerprint}}
    else:
        identity = files_identity(source_files_of(source.kind, source.name, source.files))
    if data.validation_file:
        validation = resolve_files(data.validation_file, data.source_of("validation_file"))
        found = files_identity(source_files_of(validation.kind, validation.name, validation.files))
        identity.update({f"validation:{name}": entry for name, entry in found.items()})
    return identity


def source_files_of(kind: str, name: str, files: tuple[str, ...]) -> list[str]:
    """The files a source reads: its listed files, or every file of a save_to_disk directory."""
    if kind == "saved":
        return sorted(str(p) for p in Path(name).expanduser().rglob("*") if p.is_file())
    return list(files)


def files_identity(files: list[str]) -> Identity:
    """Each file by its name relative to the files' common folder (a corpus moved elsewhere keeps its names)."""
    if not files:
        return {}
    if any(is_remote(f) for f in files):
        return remote_identity(files)
    stats = {f: os.stat(f) for f in files}
    whole = sum(s.st_size for s in stats.values()) <= WHOLE_DIGEST_BYTES
    return {relative_name(f, files): local_entry(f, stats[f], whole) for f in files}


def relative_name(path: str, files: list[str]) -> str:
    if len(files) == 1:
        return PurePosixPath(path).name
    return str(PurePosixPath(path).relative_to(os.path.commonpath(files)))


def local_entry(path: str, stat: os.stat_result, whole: bool) -> dict[str, Any]:
    sampled = not whole and stat.st_size > 3 * SAMPLE_BYTES
    with open(path, "rb") as handle:
        if not sampled:
            digest = hashlib.file_digest(handle, "sha256")
        else:
            digest = hashlib.sha256()
            for offset in (0, stat.st_size // 2, stat.st_size - SAMPLE_BYTES):
                handle.seek(offset)
                digest.update(handle.read(SAMPLE_BYTES))
    return {
        "size": stat.st_size,
        "modified": datetime.fromtimestamp(stat.st_mtime, UTC).isoformat(timespec="seconds"),
        "sha256": digest.hexdigest(),
        "sampled": sampled,
    }


def remote_identity(files: list[str]) -> Identity:
    """Remote files by their size and the version their store gives (fsspec's info: a HEAD request each)."""
    import fsspec  # only remote sources need it

    found: Identity = {}
    shown = [shown_url(f) for f in files]
    for url, name in zip(files, shown, strict=True):
        fs, path = fsspec.core.url_to_fs(url)
        info = fs.info(path)
        version = next((str(info[k]) for k in ("ETag", "etag", "md5", "LastModified", "mtime") if info.get(k)), None)
        found[relative_name(name, shown)] = {"size": info.get("size"), "version": version}
    return found


def changes(recorded: Identity | None, now: Identity) -> tuple[list[str], list[str]]:
    """What changed from ``recorded`` (a checkpoint's or run.json's record; None: none was recorded) to ``now``,
    one phrase each, and the notes that are no change (a sampled file modified since, with the same samples)."""
    if not isinstance(recorded, dict):
        return [], []
    changed, notes = [], []
    for name in sorted(recorded.keys() | now.keys()):
        before, after = recorded.get(name), now.get(name)
        if before is None:
            changed.append(f"{name} added")
        elif after is None:
            changed.append(f"{name} gone")
        elif not isinstance(before, dict) or any(before.get(k) != after.get(k) for k in content_keys(after)):
            changed.append(f"{name}: {described(after)} (recorded: {described(before)})")
        elif after.get("sampled") and before.get("modified") != after.get("modified"):
            notes.append(f"{name} was modified since ({after.get('modified')}; its sampled content is the same)")
    return changed, notes


def content_keys(entry: dict[str, Any]) -> Iterable[str]:
    return [k for k in entry if k not in ("modified", "sampled")]


def described(entry: Any) -> str:
    if not isinstance(entry, dict):
        return repr(entry)
    size = f"{entry['size']:,} bytes" if isinstance(entry.get("size"), int) else None
    rest = [
        f"{k} {v if k == 'modified' else str(v)[:12]}"  # a digest's first 12 digits tell two apart
        for k, v in entry.items()
        if k not in ("size", "sampled") and v is not None
    ]
    return ", ".join([*([size] if size else []), *rest])
