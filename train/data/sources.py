"""Where a corpus is and what it is made of, decided once for both modes (in memory and streamed).

A source is ``demo`` (the seed's sentence repeated); a file (.txt one example per line, .jsonl/.json, .csv,
.parquet; text formats also compressed: .gz, .bz2, .xz, .zst), a directory or glob of such files, or a directory
written by ``save_to_disk``, local or remote through fsspec (``s3://``, ``gs://``, ``hf://``, ``https://``,
credentials from the filesystem's usual environment); else a hub dataset id. :func:`resolve` names which, and
lists and checks the files; train/data/load.py reads the answer into memory, train/data/stream.py as a stream.
The suffixes are train.common.hf's one list (BUILDERS, COMPRESSIONS), which also decides local path vs hub id.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from datasets import Dataset

from train.common.errors import ConfigError, first_line
from train.common.hf import BUILDERS, COMPRESSIONS, DEMO_DATASET, is_hub_dataset
from train.common.urls import URL
from train.config import shown

DEMO = DEMO_DATASET
DEMO_SENTENCE = "This is a training sample for multi-GPU demonstration."
GLOB = re.compile(r"[*?\[]")
SAVED_MARKERS = ("dataset_info.json", "dataset_dict.json")  # what save_to_disk writes beside its Arrow files

SourceKind = Literal["demo", "files", "saved", "hub"]


@dataclass(frozen=True)
class Source:
    """A resolved corpus: ``kind`` says how to read ``name``. ``files`` (and their one ``builder``) are listed and
    checked for ``files``; a ``saved`` directory and a ``hub`` id are read by datasets itself."""

    kind: SourceKind
    name: str
    label: str  # the option that named it, for messages: MLM_DATASET, --validation_file, ...
    builder: str | None = None
    files: tuple[str, ...] = ()
    config_name: str | None = None  # a hub dataset's configuration


def resolve(name: str, label: str, config_name: str | None = None) -> Source:
    """What ``name`` (the dataset option, set by ``label``) is: demo, local/remote files, a save_to_disk directory,
    or a hub id. Files are listed and checked now, so a missing or unreadable one is a one-line error."""
    if name == DEMO:
        return Source("demo", name, label)
    if is_hub_dataset(name):
        return Source("hub", name, label, config_name=config_name)
    return resolve_files(name, label)


def resolve_files(path: str, label: str) -> Source:
    """A local or remote path that must hold data (never a hub id: validation_file): a save_to_disk directory, or
    the files of a file, directory or glob."""
    try:
        if is_saved_dataset(path):
            return Source("saved", path, label)
        builder, files = source_files(path, label)
    except OSError as exc:  # the path itself cannot be asked about: too long (ENAMETOOLONG), a parent unreadable
        raise ConfigError(
            f"{label}={shown(path)}: {exc.strerror or first_line(exc)}; expected a readable file, directory or glob"
        ) from None
    return Source("files", path, label, builder=builder, files=tuple(files))


def is_saved_dataset(path: str) -> bool:
    """A local directory written by ``save_to_disk`` (a Dataset or a DatasetDict)."""
    target = Path(path).expanduser()
    return not is_remote(path) and target.is_dir() and any((target / m).exists() for m in SAVED_MARKERS)


def demo_dataset(column: str, samples: int) -> Dataset:
    """The seed's demo corpus: one sentence, ``samples`` times."""
    return Dataset.from_dict({column: [DEMO_SENTENCE] * samples})


def is_remote(name: str) -> bool:
    """A URL that fsspec reads (s3://, gs://, hf://, https://, ...): files, not a hub dataset id."""
    match = URL.match(name)  # the one URL grammar (train/common/urls.py)
    return match is not None and match["protocol"].lower() != "file"


def shown_url(name: str) -> str:
    """``name`` without the user:password part a URL may carry, for messages."""
    return re.sub(r"^([a-z][a-z0-9+.-]*://)[^/@]*@", r"\1", name, flags=re.I)


def data_format(name: str) -> str | None:
    """The datasets builder for a file name, through one compression suffix (data.jsonl.zst: json); else None."""
    suffixes = [suffix.lower() for suffix in PurePosixPath(name).suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes.pop()
    return BUILDERS.get(suffixes[-1]) if suffixes else None


def one_format(files: list[str], label: str, path: str) -> str:
    """The one builder of ``files``: none, an unknown suffix or a mix of formats is the user's error."""
    if not files:
        raise ConfigError(
            f"{label}={shown_url(path)!r}: no {'/'.join(BUILDERS)} files (also {'/'.join(COMPRESSIONS)}) there"
        )
    formats = {data_format(f) for f in files}
    if None in formats:
        odd = PurePosixPath(next(f for f in files if data_format(f) is None))
        raise ConfigError(
            f"{label}={shown_url(path)!r}: unsupported extension {''.join(odd.suffixes[-2:]) or '(none)'!r}; "
            "expected one of " + ", ".join(BUILDERS) + " (optionally compressed: " + ", ".join(COMPRESSIONS) + ")"
        )
    if len(formats) > 1:
        raise ConfigError(f"{label}={shown_url(path)!r}: files of several formats; expected one format per source")
    return formats.pop()  # type: ignore[return-value]


def source_files(path: str, label: str) -> tuple[str, list[str]]:
    """The builder and files of a local or remote path (file, directory, glob)."""
    files = remote_files(path, label) if is_remote(path) else local_files(path, label)
    return one_format(files, label, path), files


def local_files(path: str, label: str) -> list[str]:
    """The files a local path names: itself, a directory's data files, or a glob's matches; sorted, checked
    readable and non-empty."""
    target = Path(path).expanduser()
    if GLOB.search(path) and not target.exists():
        files = sorted(str(p) for p in target.parent.glob(target.name) if p.is_file()) if target.parent.is_dir() else []
        if not files:
            raise ConfigError(f"{label}={path!r}: the pattern matches no file")
    elif not target.exists():
        raise ConfigError(f"{label}={path!r}: no such file or directory")
    elif not os.access(target, os.R_OK):
        raise ConfigError(f"{label}={path!r}: not readable (permission denied)")
    elif target.is_dir():
        files = sorted(str(p) for p in target.iterdir() if p.is_file() and data_format(p.name))
    else:
        files = [str(target)]
    one_format(files, label, path)
    for file in files:
        if not os.access(file, os.R_OK):
            raise ConfigError(f"{label}={file!r}: not readable (permission denied)")
        if os.stat(file).st_size == 0:
            raise ConfigError(f"{label}={file!r}: the file is empty; expected at least one example")
    return files


def remote_files(url: str, label: str) -> list[str]:
    """The files a URL names, listed through fsspec: itself, a "directory"'s data files, or a glob's matches."""
    import fsspec  # only remote sources need it

    shown = shown_url(url)
    try:
        fs, root = fsspec.core.url_to_fs(url)
        if GLOB.search(root):
            found = sorted(fs.glob(root))
        elif fs.isdir(root):
            found = sorted(f for f in fs.ls(root, detail=False) if data_format(f) and fs.isfile(f))
        elif fs.exists(root):
            found = [root]
        else:
            raise ConfigError(f"{label}={shown!r}: no such file or prefix")
    except ConfigError:
        raise
    except (ImportError, ValueError) as exc:  # fsspec: no filesystem for the scheme, or its package is missing
        raise ConfigError(f"{label}={shown!r}: cannot be read ({first_line(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - credentials, network, permissions: the filesystem says which
        raise ConfigError(f"{label}={shown!r}: cannot be listed ({first_line(exc)}); check the credentials") from None
    if not found:
        raise ConfigError(f"{label}={shown!r}: the pattern matches no file")
    files = [fs.unstrip_protocol(f) for f in found]
    one_format(files, label, url)
    return files


def read_error(label: str, path: str, exc: BaseException) -> ConfigError:
    """The one-line error for a source that was found but could not be parsed."""
    cause: BaseException = exc
    while cause.__cause__ is not None:  # datasets wraps the parser's error; its message is the useful one
        cause = cause.__cause__
    first = first_line(cause)
    if (isinstance(cause, UnicodeDecodeError) or "codec can't decode" in first) and not is_remote(path):
        where = first_undecodable_line(path, label)
        first = f"not UTF-8{where}; expected UTF-8 text (convert it, e.g. iconv -f latin1 -t utf-8)"
    return ConfigError(f"{label}={shown_url(path)!r}: cannot be read ({first})")


def first_undecodable_line(path: str, label: str, limit: int = 10_000_000) -> str:
    """' (file F, line N)' for the first line that is not UTF-8, read as (decompressed) bytes; '' when none is
    found quickly."""
    import fsspec  # decompresses by extension, as the builders do

    files = local_files(path, label)
    for file in files:
        try:
            with fsspec.open(file, "rb", compression="infer") as handle:
                for number, raw in enumerate(handle, start=1):
                    if number > limit:
                        break
                    try:
                        raw.decode("utf-8")
                    except UnicodeDecodeError:
                        return f" (line {number})" if len(files) == 1 else f" ({Path(file).name}, line {number})"
        except OSError:
            continue
    return ""
