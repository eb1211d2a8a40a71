"""One job per output_dir in an object store: train/outputs/lease.py's lease (its record, its rules for a stale
holder, its waiting and its messages) kept as the object ``.lease`` in the store's root.

What is guaranteed depends on what the store honours, probed once per acquire rather than assumed
(:func:`capabilities`: a second conditional write of a probe object must be refused):
- conditional create, PutObject ``If-None-Match: *`` (s3fs: ``pipe_file(..., mode="create")``; AWS S3 and moto's
  server honour it, tests/test_store.py checks it for real): of jobs creating the lease at once, exactly one wins;
- conditional replace, PutObject ``If-Match: <ETag>`` (s3fs passes the argument through to PutObject): of jobs
  taking over a stale lease at once exactly one wins, and a heartbeat never overwrites a lease taken over.
Where a store lacks or ignores them, the lease falls back to train/outputs/lease.py's write, wait ``settle_s``, read
back: two jobs starting within that moment can both believe they hold it; a warning says so when the lease is taken.

A holder on another host is stale when its record's ``renewed`` (its clock, rewritten every HEARTBEAT_S) is older
than EXPIRY_S: the hosts' clocks must agree within EXPIRY_S - HEARTBEAT_S. Release deletes the lease after
checking it is still ours (no conditional delete: a takeover in between needs our lease stale, we being alive).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from train.common.errors import UserError
from train.outputs.lease import EXPIRY_S, HEARTBEAT_S, OutputLease
from train.outputs.runfiles import RunFiles
from train.outputs.store import NAMES, PROBE_PREFIX, Store, error_code, missing

UNSUPPORTED = (TypeError, NotImplementedError, ValueError)  # a filesystem without the argument


def refused(exc: BaseException) -> bool:
    """A conditional write refused: the object exists (create), its ETag changed or it is gone (replace)."""
    return isinstance(exc, (FileExistsError, FileNotFoundError)) or error_code(exc) == "PreconditionFailed"


def _honoured(store: Store, what: str, key: str, **condition: Any) -> bool:
    """A write that ``condition`` must refuse (the probe object exists, its ETag is not "0") is refused."""
    try:
        store.retrying(
            what,
            store.fs.pipe_file,
            key,
            b"2",
            expected=lambda e: isinstance(e, UNSUPPORTED) or refused(e),
            **condition,
        )
    except Exception as exc:  # noqa: BLE001 - only the expected ones reach here unchanged
        return refused(exc)
    return False


def capabilities(store: Store) -> tuple[bool, bool]:
    """(conditional create honoured, conditional replace honoured), by trying them on a probe object."""
    name = f"{PROBE_PREFIX}lease-{uuid.uuid4().hex}"
    key = store.key(name)
    store.pipe(name, b"1")
    try:
        create = _honoured(store, f"writing {name}", key, mode="create")
        replace = create and _honoured(store, f"writing {name}", key, IfMatch='"0"')
    finally:
        store.retrying(f"deleting {name}", store.fs.rm_file, key, expected=missing)
    return create, replace


class _Place:
    """Stands in for OutputLease.path, whose ``parent`` names the output dir in OutputLease's messages."""

    def __init__(self, url: str) -> None:
        self.parent = url


class StoreLease(OutputLease):
    def __init__(self, store: Store, clock: Callable[[], float] = time.time, settle_s: float = 0.5) -> None:
        super().__init__(RunFiles("."), store.label, clock)
        self.store, self.key, self.settle_s = store, store.key(NAMES.lease), settle_s
        self.path = cast(Path, _Place(store.url))
        self.create_ok = self.replace_ok = False
        self.etag: str | None = None  # the lease's ETag as this job last wrote it
        self.seen: str | None = None  # as last read

    def _body(self) -> bytes:
        return json.dumps({**self.record, "renewed": self.clock()}).encode()

    def _ours(self) -> bool:
        mine = (self.holder() or {}).get("token") == self.token
        if mine:
            self.etag = self.seen
        return mine

    def _write(self, **condition: Any) -> bool:
        """Write this job's record under ``condition``: whether the lease is this job's now."""
        try:
            out = self.store.retrying(
                "writing the lease", self.store.fs.pipe_file, self.key, self._body(), expected=refused, **condition
            )
        except OSError:  # refused (a retry refused after the first attempt landed reads back as ours)
            return self._ours()
        self.etag = out.get("ETag") if isinstance(out, dict) else None
        return True

    def _settled(self) -> bool:
        """train/outputs/lease.py's rule where the store has no conditions: of several writers, the one whose record
        stays."""
        self._write()
        time.sleep(self.settle_s)
        return self._ours()

    # -- OutputLease's primitives, on the store --
    def holder(self) -> dict[str, Any] | None:
        self.store.fs.invalidate_cache()
        try:
            info = self.store.retrying("reading the lease", self.store.fs.info, self.key, expected=missing)
            body = self.store.retrying("reading the lease", self.store.fs.cat_file, self.key, expected=missing)
        except FileNotFoundError:
            return None
        self.seen = info.get("ETag")
        try:
            record = json.loads(body)
        except ValueError:
            return {}  # not ours to read: judged stale (an object is written whole, never half)
        return record if isinstance(record, dict) else {}

    def stale(self, holder: dict[str, Any]) -> bool:
        if self._here(holder):
            return not self._alive_here(holder)
        renewed = holder.get("renewed")
        return not isinstance(renewed, (int, float)) or self.clock() - renewed > EXPIRY_S

    def _create(self) -> bool:
        if self.create_ok:
            return self._write(mode="create")
        return self.holder() is None and self._settled()

    def _take_over(self) -> bool:
        if self.replace_ok and self.seen:
            return self._write(IfMatch=self.seen)
        return self._settled()

    def acquire(self, wait_s: float = 0.0, sleep: Callable[[float], None] = time.sleep) -> None:
        self.create_ok, self.replace_ok = capabilities(self.store)
        if not self.create_ok:
            self.store.warn(
                f"{self.label}={self.store.url!r}: the store does not honour conditional writes (If-None-Match): "
                "the lease cannot stop two jobs started at the same moment; start one job per output_dir"
            )
        super().acquire(wait_s, sleep)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if self.replace_ok and self.etag:
                    if not self._write(IfMatch=self.etag):
                        return  # taken over (this job was judged lost): nothing of ours to renew
                elif self._ours():
                    self._write()
                else:
                    return
            except (OSError, UserError):
                continue  # the store unreachable for now: try again at the next beat

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            if self._ours():
                self.store.fs.rm_file(self.key)
        except (OSError, UserError):
            pass
