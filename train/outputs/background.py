"""Checkpoints written behind the training loop: :class:`BackgroundSaves`, the writer (train/run/saving.py hands it a
snapshot of the state and says what to write).

The rules it keeps, whatever the caller hands it:

- **one write in flight at most**: a save starts only once the one before has ended (:meth:`BackgroundSaves.start`
  waits for it first), so the host memory of one snapshot suffices and saves end in the order they began;
- **in step order**: a save of a step before the last one started is refused (a bug, never a silent overwrite); a
  second save of the same step (a phase's last step saved by its end and by the Trainer's own rule) is written
  again once the first is whole, as the Trainer's synchronous save overwrites it;
- **the marker, then the rotation, last**: a save writes its files, then its ``.complete`` marker, and only then
  rotates the older checkpoints away, so the newest complete checkpoint is never deleted while another is written
  (the Trainer's own save rotates before it has finished: train/outputs/checkpoints.py);
- **a failure is the training thread's**: what the background thread raised (a full disk's OSError) is raised again
  on the training thread at the next :meth:`BackgroundSaves.wait` or :meth:`BackgroundSaves.start`, so that it
  ends the job as a synchronous save's would (a full disk is exit 3: docs/exit-codes.md); a failed save rotates
  nothing away.

Nothing here runs a collective: the digest gather across ranks stays on the training thread (the caller's).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

THREAD_NAME = "checkpoint-writer"


@dataclass(frozen=True)
class BackgroundSave:
    """One save's work behind the loop, in its order: ``write`` its files, ``mark`` it complete, ``rotate`` the older
    checkpoints away; then ``done`` is told the seconds all that took (the records' ``save_background_s``)."""

    step: int
    write: Callable[[], None]
    mark: Callable[[], None]
    rotate: Callable[[], None]
    done: Callable[[float], None]


class BackgroundSaves:
    """At most one checkpoint write in flight, on a thread of its own; its failure raised on the caller's thread."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._last_step: int | None = None

    @property
    def in_flight(self) -> bool:
        """Whether a save is being written now."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, save: BackgroundSave) -> None:
        """Write ``save`` behind the caller, once the save in flight (if any) has ended; that one's failure is
        raised here instead, and ``save`` is not started."""
        self.wait()
        if self._last_step is not None and save.step < self._last_step:
            raise ValueError(f"a save of step {save.step} after one of step {self._last_step}: saves go in step order")
        self._last_step = save.step
        self._thread = threading.Thread(target=self._run, args=(save,), name=THREAD_NAME, daemon=True)
        self._thread.start()

    def rewind(self, step: int) -> None:
        """After a rollback to ``step`` (train/run/rollback.py): the saves after it are set aside, and the steps
        trained again save in order from there. Waits for the save in flight first."""
        self.wait()
        self._last_step = step

    def wait(self) -> None:
        """Return once no save is in flight; raise what the last one raised (once)."""
        thread = self._thread
        if thread is not None:
            thread.join()
            self._thread = None
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def _run(self, save: BackgroundSave) -> None:
        started = time.monotonic()
        try:
            save.write()
            save.mark()
            save.rotate()
            save.done(time.monotonic() - started)
        except BaseException as exc:  # handed to the training thread, which raises it
            self._failure = exc
