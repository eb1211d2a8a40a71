"""The background writer of checkpoints (train/outputs/background.py): one save in flight, in step order, the
marker before the rotation, a failure raised on the caller's thread."""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import checkpoint
from train.outputs.background import BackgroundSave, BackgroundSaves
from train.outputs.marker import mark_complete
from train.outputs.runfiles import COMPLETE_MARKER, RunFiles

WAIT_S = 10  # a bound against a hang, never reached when the code is right


def recorded(events: list[str], step: int, write: object = None) -> BackgroundSave:
    """A save of ``step`` that appends each of its parts to ``events`` as it runs (``write``: run first)."""

    def part(name: str) -> Callable[..., None]:
        def run(*_: object) -> None:
            if name == "write" and callable(write):
                write()
            events.append(f"{name} {step}")

        return run

    return BackgroundSave(step, part("write"), part("mark"), part("rotate"), part("done"))


def test_a_save_writes_marks_and_rotates_in_that_order_behind_the_caller() -> None:
    saves, events = BackgroundSaves(), []
    saves.start(recorded(events, 10))
    saves.wait()
    assert events == ["write 10", "mark 10", "rotate 10", "done 10"]
    assert not saves.in_flight


def test_one_save_in_flight_the_next_starts_once_it_ended() -> None:
    saves, events, release = BackgroundSaves(), [], threading.Event()
    saves.start(recorded(events, 10, write=lambda: release.wait(WAIT_S)))
    assert saves.in_flight
    second = threading.Thread(target=saves.start, args=(recorded(events, 20),))
    second.start()
    second.join(0.3)
    assert second.is_alive() and events == []  # the second save waits for the first's write
    release.set()
    second.join(WAIT_S)
    saves.wait()
    assert events == [f"{part} {step}" for step in (10, 20) for part in ("write", "mark", "rotate", "done")]


def test_saves_go_in_step_order() -> None:
    """A step saved twice (a phase's end and the Trainer's rule at one step) is written again once the first is
    whole; an earlier step is refused."""
    saves, events = BackgroundSaves(), []
    saves.start(recorded(events, 20))
    saves.start(recorded(events, 20))
    with pytest.raises(ValueError, match="a save of step 10 after one of step 20: saves go in step order"):
        saves.start(recorded(events, 10))
    assert events == ["write 20", "mark 20", "rotate 20", "done 20"] * 2


def test_a_failed_write_is_raised_on_the_callers_thread_once_and_rotates_nothing() -> None:
    saves, events = BackgroundSaves(), []
    full = OSError(errno.ENOSPC, "No space left on device")

    def fail() -> None:
        raise full

    saves.start(recorded(events, 10, write=fail))
    with pytest.raises(OSError) as raised:
        saves.wait()
    assert raised.value is full  # the same error: the job's exit code for a full disk reads its errno
    assert events == []  # no marker, no rotation: the older checkpoints stay
    saves.wait()  # raised once


def test_the_next_save_raises_the_failure_before_it_starts() -> None:
    saves, events = BackgroundSaves(), []

    def fail() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    saves.start(recorded(events, 10, write=fail))
    with pytest.raises(OSError, match="No space left"):
        saves.start(recorded(events, 20))
    assert events == [] and not saves.in_flight


def test_the_rotation_runs_once_the_new_checkpoint_is_marked_complete(tmp_path: Path) -> None:
    """The newest complete checkpoint is never deleted while another is written: the older one goes only after the
    new one's marker."""
    files = RunFiles(tmp_path)
    checkpoint(tmp_path, 10)
    new = files.checkpoint(20)
    seen: list[tuple[bool, bool]] = []

    def write() -> None:
        new.mkdir()
        (new / "model.safetensors").write_bytes(b"w")
        seen.append(((files.checkpoint(10) / COMPLETE_MARKER).exists(), (new / COMPLETE_MARKER).exists()))

    def rotate() -> None:
        seen.append(((files.checkpoint(10) / COMPLETE_MARKER).exists(), (new / COMPLETE_MARKER).exists()))
        files.checkpoint(10).rename(tmp_path / "rotated")

    saves = BackgroundSaves()
    saves.start(BackgroundSave(20, write, lambda: mark_complete(new), rotate, lambda seconds: None))
    saves.wait()
    assert seen == [(True, False), (True, True)]  # while writing, the older one stays; it goes after the marker
    assert [p.name for p in files.checkpoints()] == ["checkpoint-20"]


def test_done_is_told_the_seconds_the_save_took_behind_the_caller() -> None:
    took: list[float] = []
    saves = BackgroundSaves()
    saves.start(BackgroundSave(5, lambda: threading.Event().wait(0.05), lambda: None, lambda: None, took.append))
    saves.wait()
    assert len(took) == 1 and took[0] >= 0.05
