"""output_dir in object storage (``s3://bucket/prefix``, ``gs://...``: any store fsspec has a filesystem for).

The job trains into a local staging directory and mirrors it here; this module knows the store, not the Trainer.
Names are train/outputs/runfiles.py's, relative to the store's root. Credentials and endpoints come from each
filesystem's
usual environment (s3: botocore reads AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE,
AWS_ENDPOINT_URL[_S3], AWS_DEFAULT_REGION itself), so nothing of ours is needed beyond optional storage options.

Object stores have no rename, so "whole or absent" is said by a marker object written last and deleted first:
- a checkpoint counts once its ``.complete`` is there: every file is uploaded, the marker last; removing one
  deletes the marker first, so one cut off halfway either way reads as incomplete and is ignored (and tidied);
- ``final/`` likewise (``final/.complete``, the same constant), with the weights uploaded after every other file:
  a reader that ignores the marker sees at worst a final/ without weights, which fails to load, never this run's
  config with another run's weights (an old final/ is unpublished and removed before the new one is uploaded);
- every other file (run.json, all_results.json, logs/, the report) is one object replaced whole (one PUT).

Every call is retried on transient errors (connection lost, timeouts, 5xx, throttling: :func:`transient`) with
exponential backoff, bounded in attempts and total time (:class:`Retry`), beneath which the filesystem's own
retries also run (s3: botocore's AWS_MAX_ATTEMPTS/AWS_RETRY_MODE, s3fs's for dropped connections). What still
fails is one line: ConfigError (exit 2) for a bucket that does not exist, EnvironmentProblem (exit 3) for refused
or missing credentials and for a store that stays unreachable. A failed upload never touches the local copy.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from train.common import console
from train.common.errors import ConfigError, EnvironmentProblem, UserError, first_line
from train.common.paths import name_problem
from train.common.urls import without_credentials
from train.outputs.checkpoints import problem
from train.outputs.retention import Retention
from train.outputs.runfiles import COMPLETE_MARKER, CUT_SHORT, RunFiles, is_checkpoint_name, step_of

LABEL = "MLM_OUTPUT_DIR"
NAMES = RunFiles(".")  # the names of output_dir, relative: NAMES.final == Path("final")
DOWNLOAD_PREFIX = ".download-"  # a checkpoint being downloaded into staging: renamed into place once whole
PROBE_PREFIX = ".write-test-"  # as train/common/writable.py's probe_write
WEIGHT_SUFFIXES = (".safetensors", ".bin")  # final/'s weights: uploaded after every other file
TRANSIENT_ERRNOS = frozenset(
    {errno.EBUSY, errno.EREMOTEIO, errno.ETIMEDOUT, errno.EAGAIN, errno.ECONNRESET, errno.ECONNABORTED}
    | {errno.ECONNREFUSED, errno.EPIPE, errno.ENETUNREACH, errno.EHOSTUNREACH}
)  # s3fs: InternalError -> EREMOTEIO, SlowDown/ServiceUnavailable -> EBUSY
TRANSIENT_CODES = frozenset(
    {"InternalError", "ServiceUnavailable", "SlowDown", "Throttling", "ThrottlingException", "RequestTimeout"}
    | {"TooManyRequests", "RequestLimitExceeded"}
)
VANISHED = "removed from the store while being read"  # a checkpoint newest_resumable could not download
T = TypeVar("T")


class BadKey(ValueError):
    """A key in the store that names no file inside the directory it is under (its words: which key, and why)."""


@dataclass(frozen=True)
class Retry:
    """Attempts of one call: waits of ``first_s``, doubling up to ``max_s``, while at most ``attempts`` are made
    and the waits stay within ``total_s`` of the first. No jitter: one job writes an output_dir (the lease)."""

    attempts: int = 6
    first_s: float = 1.0
    max_s: float = 30.0
    total_s: float = 300.0
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic


def _chain(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    while exc is not None and exc not in found:
        found.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return found


@functools.cache
def _types(*names: str) -> tuple[type[BaseException], ...]:
    """Exception types of the HTTP clients fsspec's filesystems use, those installed ("module:Name")."""
    import importlib

    found = []
    for name in names:
        module, _, attribute = name.partition(":")
        try:
            found.append(getattr(importlib.import_module(module), attribute))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _connection_errors() -> tuple[type[BaseException], ...]:
    boto = ("botocore.exceptions:HTTPClientError", "botocore.exceptions:ConnectionError")
    return ConnectionError, TimeoutError, *_types(*boto, "aiohttp:ClientConnectionError", "aiohttp:ClientPayloadError")


def _credential_errors() -> tuple[type[BaseException], ...]:
    return _types(
        "botocore.exceptions:NoCredentialsError",
        "botocore.exceptions:PartialCredentialsError",
        "botocore.exceptions:CredentialRetrievalError",
        "google.auth.exceptions:DefaultCredentialsError",
    )


def error_code(exc: BaseException) -> str | None:
    """The store's own error code (botocore's ClientError: ``response["Error"]["Code"]``), if any in the chain."""
    for cause in _chain(exc):
        response = getattr(cause, "response", None)
        if isinstance(response, dict) and response.get("Error", {}).get("Code"):
            return str(response["Error"]["Code"])
    return None


def said(exc: BaseException) -> str:
    """What the store said, in one line: an OSError's text without its "[Errno N]"."""
    return first_line(OSError(exc.strerror)) if isinstance(exc, OSError) and exc.strerror else first_line(exc)


def missing(exc: BaseException) -> bool:
    """A key that is not there (on a read or a delete; on a write or a listing it is the bucket that is missing)."""
    return isinstance(exc, FileNotFoundError)


def transient(exc: BaseException) -> bool:
    """Worth another attempt: a connection lost or refused, a timeout, a 5xx answer or throttling (by type, errno
    or the store's status and code); never a missing bucket or key, refused credentials or a failed condition."""
    for cause in _chain(exc):
        if isinstance(cause, (FileNotFoundError, FileExistsError, PermissionError, *_credential_errors())):
            return False
        if isinstance(cause, _connection_errors()):
            return True
        if isinstance(cause, OSError) and cause.errno in TRANSIENT_ERRNOS:
            return True
        response = getattr(cause, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            return status >= 500 or status == 429 or response.get("Error", {}).get("Code") in TRANSIENT_CODES
    return False


class Store:
    """One output_dir in an object store: ``fs`` (an fsspec filesystem) and ``root`` (a bucket and prefix)."""

    def __init__(
        self,
        url: str,
        label: str = LABEL,
        retry: Retry | None = None,
        storage_options: dict[str, Any] | None = None,
        warn: Callable[[str], None] = console.warn,
    ) -> None:
        import fsspec

        self.label, self.retry, self.warn = label, retry or Retry(), warn
        try:  # its own instance: fsspec would share one (credentials and listings cached) per set of options
            self.fs, root = fsspec.core.url_to_fs(url, skip_instance_cache=True, **(storage_options or {}))
        except (ImportError, ValueError) as exc:  # no filesystem for the protocol, or its package missing
            shown = without_credentials(url)
            raise ConfigError(f"{label}={shown!r}: not a store this image can write ({said(exc)})") from None
        self.root = root.rstrip("/")
        self.url = self.fs.unstrip_protocol(self.root)  # for messages: never holds credentials

    def key(self, name: str | PurePosixPath | Path) -> str:
        return f"{self.root}/{PurePosixPath(name).as_posix()}"

    # -- one call, retried --
    def retrying(
        self,
        what: str,
        call: Callable[..., T],
        *args: Any,
        expected: Callable[[BaseException], bool] | None = None,
        **kwargs: Any,
    ) -> T:
        """``call(*args, **kwargs)`` under the retry policy; a failure is one UserError naming ``what``, except the
        errors ``expected`` accepts (e.g. :func:`missing`: a key gone), raised unchanged for the caller."""
        start, attempt = self.retry.clock(), 0
        while True:
            attempt += 1
            try:
                return call(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - every filesystem raises its own: judged by transient()
                if expected is not None and expected(exc):
                    raise
                delay = min(self.retry.max_s, self.retry.first_s * 2 ** (attempt - 1))
                spent = self.retry.clock() - start
                if not transient(exc) or attempt >= self.retry.attempts or spent + delay > self.retry.total_s:
                    raise self.failure(what, exc, attempt) from exc
                self.warn(f"{self.label}={self.url!r}: {what} failed ({said(exc)}); retrying in {delay:g} s")
                self.retry.sleep(delay)

    def failure(self, what: str, exc: BaseException, attempts: int = 1) -> UserError:
        where = f"{self.label}={self.url!r}"
        if isinstance(exc, FileNotFoundError):  # a write, a listing: the bucket (container) itself is missing
            return ConfigError(
                f"{where}: the bucket does not exist ({said(exc)}); expected an existing bucket: create it "
                "or correct the URL"
            )
        if isinstance(exc, (PermissionError, *_credential_errors())):
            return EnvironmentProblem(
                f"{where}: {what} was refused ({said(exc)}); expected credentials allowed to list, write and "
                "delete there, in the store's usual environment (s3: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
            )
        after = f" after {attempts} attempts" if attempts > 1 else ""
        kept = "; the local copy is kept" if what.startswith("writing") else ""
        return EnvironmentProblem(f"{where}: {what} failed{after} ({said(exc)}){kept}; expected a reachable store")

    def put(self, local: Path, name: str | PurePosixPath | Path) -> None:
        self.retrying(f"writing {PurePosixPath(name)}", self.fs.put_file, str(local), self.key(name))

    def pipe(self, name: str | PurePosixPath | Path, data: bytes, **kwargs: Any) -> Any:
        return self.retrying(f"writing {PurePosixPath(name)}", self.fs.pipe_file, self.key(name), data, **kwargs)

    def exists(self, name: str | PurePosixPath | Path) -> bool:
        self.fs.invalidate_cache()
        return bool(self.retrying(f"reading {PurePosixPath(name)}", self.fs.exists, self.key(name)))

    def listing(self, name: str | PurePosixPath | Path = "") -> list[PurePosixPath]:
        """Every object under ``name`` (all of root by default), relative to root; fresh (no cached listing)."""
        self.fs.invalidate_cache()
        top = self.key(name) if name else self.root
        found = self.retrying(f"listing {PurePosixPath(name) if name else 'the store'}", self.fs.find, top)
        return sorted(PurePosixPath(key).relative_to(self.root) for key in found)

    def remove(self, name: str | PurePosixPath | Path) -> None:
        """Delete a directory of the store, its completeness marker first: cut off halfway, it reads incomplete."""
        marker = PurePosixPath(name) / COMPLETE_MARKER
        try:
            self.retrying(f"deleting {marker}", self.fs.rm_file, self.key(marker), expected=missing)
        except FileNotFoundError:
            pass  # not complete, or not there at all
        keys = [self.key(rel) for rel in self.listing(name)]
        if keys:
            self.retrying(f"deleting {PurePosixPath(name)}", self.fs.rm, keys)

    # -- the checks before a run --
    def preflight(self) -> None:
        """The bucket exists, the credentials may list, write and delete there (a probe object written and removed).
        ConfigError (exit 2) for a missing bucket, EnvironmentProblem (exit 3) otherwise."""
        probe = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        self.pipe(probe, b"\0" * 1024)
        self.retrying(f"deleting {probe}", self.fs.rm_file, self.key(probe))
        self.checkpoint_steps()

    def has_final(self) -> bool:
        """A finished model is in the store (its final/ was published whole, not by a stopped run)."""
        return self.exists(NAMES.final / COMPLETE_MARKER) and not self.exists(NAMES.final / CUT_SHORT)

    # -- checkpoints --
    def upload_checkpoint(self, local: Path) -> int:
        """Upload a checkpoint directory of the staging dir, its ``.complete`` marker last; returns its step.
        A copy of the same step already in the store (cut off, or saved again) is removed first. (Several ranks
        share the work with the three steps: :meth:`remove`, :meth:`put_checkpoint_files`, :meth:`mark`.)"""
        if not is_checkpoint_name(local.name) or not local.is_dir():
            raise ValueError(f"{local}: not a checkpoint directory")
        self.remove(NAMES.checkpoint(step_of(local)))
        self.put_checkpoint_files(local, lambda path: True)
        self.mark(local)
        return step_of(local)

    def put_checkpoint_files(self, local: Path, chosen: Callable[[Path], bool]) -> None:
        """Upload the files of a local checkpoint that ``chosen`` accepts, never its marker."""
        name = NAMES.checkpoint(step_of(local))
        for path in sorted(p for p in local.rglob("*") if p.is_file() and p.name != COMPLETE_MARKER):
            if chosen(path.relative_to(local)):
                self.put(path, name / path.relative_to(local))

    def mark(self, local: Path) -> None:
        """Write the completeness marker of a checkpoint every file of which is uploaded."""
        marker = local / COMPLETE_MARKER
        body = marker.read_bytes() if marker.is_file() else f"{console.now()}\n".encode()
        self.pipe(NAMES.checkpoint(step_of(local)) / COMPLETE_MARKER, body)

    def move(self, name: str | PurePosixPath | Path, to: str | PurePosixPath | Path) -> None:
        """Rename a directory of the store: each object copied (a server-side copy where the store has one, as
        S3 does), then the original removed, its marker first. Cut off halfway, the original still stands."""
        source = PurePosixPath(name)
        for rel in sorted(self.listing(source), key=lambda rel: rel.name == COMPLETE_MARKER):  # the marker last
            target = PurePosixPath(to) / rel.relative_to(source.as_posix())
            self.retrying(f"copying {rel}", self.fs.copy, self.key(rel), self.key(target))
        self.remove(source)

    def checkpoint_steps(self) -> dict[int, bool]:
        """Every checkpoint in the store, step -> whether it is complete (its marker is there)."""
        steps: dict[int, bool] = {}
        for rel in self.listing():
            if len(rel.parts) >= 2 and is_checkpoint_name(rel.parts[0]):
                step = step_of(Path(rel.parts[0]))
                steps[step] = steps.get(step, False) or rel.parts[1:] == (COMPLETE_MARKER,)
        return steps

    def complete_checkpoints(self) -> list[int]:
        """The steps of the complete checkpoints, newest first."""
        return sorted((step for step, done in self.checkpoint_steps().items() if done), reverse=True)

    def download_checkpoint(self, step: int, staging: Path) -> Path:
        """Download checkpoint-``step`` into ``staging`` under a temporary name, renamed into place once whole.
        FileNotFoundError when it is not in the store (or vanished while being read); BadKey, before anything is
        read, when a key would not land inside it (a ``..`` part, train/common/paths.py's rule)."""
        target = RunFiles(staging).checkpoint(step)
        partial = staging / f"{DOWNLOAD_PREFIX}{target.name}-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        files = self.listing(NAMES.checkpoint(step))
        if not files:
            raise FileNotFoundError(f"{target.name} is not in {self.url}")
        inner = [rel.relative_to(NAMES.checkpoint(step).as_posix()).as_posix() for rel in files]
        wrong = next((f"{target.name}/{problem}" for name in inner if (problem := name_problem(name))), None)
        if wrong:
            raise BadKey(wrong)
        try:
            for rel in files:
                destination = partial / rel.relative_to(NAMES.checkpoint(step).as_posix())
                destination.parent.mkdir(parents=True, exist_ok=True)
                self.retrying(f"reading {rel}", self.fs.get_file, self.key(rel), str(destination), expected=missing)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(partial, target)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        return target

    def newest_resumable(self, staging: Path) -> tuple[Path | None, list[tuple[int, str]]]:
        """(the newest complete checkpoint that downloads and passes train/outputs/checkpoints.problem(), now in
        ``staging``; the newer ones that did not, with why). An unusable one is removed from staging, kept in the
        store (saving that step again replaces it)."""
        skipped: list[tuple[int, str]] = []
        for step in self.complete_checkpoints():
            try:
                local = self.download_checkpoint(step, staging)
            except FileNotFoundError:
                skipped.append((step, VANISHED))
                continue
            except BadKey as exc:
                skipped.append((step, str(exc)))
                continue
            reason = problem(local)
            if reason is None:
                return local, skipped
            shutil.rmtree(local, ignore_errors=True)
            skipped.append((step, reason))
        return None, skipped

    def rotate(self, retention: Retention, protect: Iterable[int] = ()) -> list[int]:
        """The retention rule in the store (train/outputs/retention.py: the newest save_total_limit complete
        checkpoints, every save_keep_every-th step, ``protect``: the best model's), the others removed, oldest
        first, and so are incomplete ones older than the newest complete one (an incomplete newer one may be an
        upload under way). Nothing when the rule keeps every checkpoint. Returns the removed."""
        if not retention.newest:
            return []
        steps = self.checkpoint_steps()
        complete = sorted((step for step, done in steps.items() if done), reverse=True)
        keep_set = retention.kept(complete, protect)
        newest = complete[0] if complete else None
        doomed = [s for s in sorted(steps) if s not in keep_set and (steps[s] or (newest is not None and s < newest))]
        for step in doomed:
            self.remove(NAMES.checkpoint(step))
        return doomed

    # -- the rest of output_dir --
    def publish_final(self, local_final: Path) -> None:
        """Upload the finished model as final/: the previous one unpublished (marker first) and removed, every
        file but the weights, the weights, then ``final/.complete``."""
        self.remove(NAMES.final)
        files = sorted(
            (p for p in local_final.rglob("*") if p.is_file() and p.name != COMPLETE_MARKER),
            key=lambda p: (p.suffix in WEIGHT_SUFFIXES, p.as_posix()),
        )
        for path in files:
            self.put(path, NAMES.final / path.relative_to(local_final))
        marker = local_final / COMPLETE_MARKER  # the list of final/'s files and digests, written last
        body = marker.read_bytes() if marker.is_file() else f"{console.now()}\n".encode()
        self.pipe(NAMES.final / COMPLETE_MARKER, body)

    def upload(self, local_root: Path, *names: Path) -> list[Path]:
        """Mirror files and directories of the staging dir (``NAMES.run_json``, ``NAMES.logs``, ...), each file one
        object replaced whole; names absent locally are skipped. Returns the names of the files uploaded."""
        done: list[Path] = []
        for name in names:
            path = local_root / name
            files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
            for file in (f for f in files if f.is_file()):
                self.put(file, file.relative_to(local_root))
                done.append(file.relative_to(local_root))
        return done
