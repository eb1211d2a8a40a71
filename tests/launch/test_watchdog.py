"""The hang watchdog's rules (train/common/progress.py) and the watchdog itself (train/launch/watchdog.py) on a
real process that reports progress and writes its stack on SIGQUIT as a rank does (train/run/progress.py)."""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from train.common.progress import (
    ENDING,
    FLOOR_S,
    SAVING,
    Progress,
    hung,
    read_progress,
    stopped_ranks,
    write_progress,
)
from train.launch.watchdog import HangBound, HangWatch


def report(rank: int, step: int, began: bool = False, at: float = 0.0, **kw: object) -> Progress:
    where = f"training step {step + 1}" if began else f"finished step {step}"
    return Progress(rank, rank, 1000 + rank, step, where, at, began=began, **kw)  # type: ignore[arg-type]


def test_the_bound_is_the_option_else_derived_from_the_gaps_a_saves_its_own_and_the_end_has_none() -> None:
    assert report(0, 3, gap_s=2.0).bound(10, 1800) == 10.0
    assert report(0, 3, gap_s=2.0).bound(0, 1800) == FLOOR_S
    assert report(0, 3, gap_s=100.0).bound(0, 1800) == 500.0
    assert report(0, 3, busy=ENDING).bound(10, 1800) == math.inf  # a push may outlast any collective timeout
    # A save: the collective timeout until one has ended, then from the longest save, never below the option.
    assert report(0, 3, busy=SAVING, gap_s=2.0).bound(10, 1800) == 1770.0  # before the collectives fail
    assert report(0, 3, busy=SAVING).bound(10, 40) == 20.0
    assert report(0, 3, busy=SAVING, save_s=2.0).bound(10, 1800) == FLOOR_S
    assert report(0, 3, busy=SAVING, save_s=100.0).bound(10, 1800) == 500.0
    assert report(0, 3, busy=SAVING, save_s=2.0).bound(10, 80) == 50.0  # never past the collectives' own end
    assert report(0, 3, busy=SAVING, save_s=2.0).bound(600, 1800) == 600.0


def test_a_node_is_hung_only_when_no_rank_moved_within_its_bound() -> None:
    assert not hung([], 1000.0, 10, 60)  # before any first step: the collective timeout acts alone
    assert hung([report(0, 3, at=980.0), report(1, 2, at=985.0)], 1000.0, 10, 60)
    assert not hung([report(0, 3, at=980.0), report(1, 2, at=995.0)], 1000.0, 10, 60)
    saving = report(0, 3, at=975.0, busy=SAVING)  # a save, within the collective timeout less the margin
    assert not hung([saving, report(1, 2, at=980.0)], 1000.0, 10, 60)
    assert hung([saving, report(1, 2, at=980.0)], 1006.0, 10, 60)  # a rank stopped in it, or a save stuck
    assert not hung([report(0, 3, at=0.0, busy=ENDING), report(1, 2, at=980.0)], 1000.0, 10, 60)
    words = HangBound(10, 60, Path("logs")).words([saving, report(1, 2, at=980.0)])
    assert words == "30 s (a checkpoint's save: 5x the longest so far, at most ddp_timeout=60 less 30 s)"


def test_the_ranks_named_are_the_silent_then_those_behind_then_those_without_a_stack_else_all() -> None:
    assert stopped_ranks([report(0, 2)], 2, {0}) == ["local rank 1"]
    behind = stopped_ranks([report(0, 2, began=True), report(1, 2)], 2, {0, 1})
    assert behind == ["rank 1 (its last progress: finished step 2)"]
    silent = stopped_ranks([report(0, 2, began=True), report(1, 2, began=True)], 2, {0})
    assert silent == ["rank 1 (its last progress: training step 3; it wrote no stack: stopped?)"]
    assert stopped_ranks([report(0, 2), report(1, 2)], 2, {0, 1}) == [
        "rank 0 (its last progress: finished step 2)",
        "rank 1 (its last progress: finished step 2)",
    ]


def test_a_record_that_does_not_read_is_skipped(tmp_path: Path) -> None:
    write_progress(tmp_path, report(0, 1, at=5.0))
    (tmp_path / "progress-rank-1.json").write_text("{not json")
    assert read_progress(tmp_path) == [report(0, 1, at=5.0)]


RANK = """
import faulthandler, os, signal, sys, time
from train.common.progress import Progress, stacks_file, write_progress
directory = sys.argv[1]
stacks = open(stacks_file(directory, 0), "w")
faulthandler.register(signal.SIGQUIT, file=stacks, all_threads=True, chain=False)
write_progress(directory, Progress(0, 0, os.getpid(), 4, "training step 5", time.time() - 60, began=True))
def stuck_in_step_5():
    while True:
        time.sleep(1)
stuck_in_step_5()
"""


@contextlib.contextmanager
def reporting_rank(runs: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process standing for a rank (RANK) that has written its record in ``runs``; killed at the end."""
    rank = subprocess.Popen([sys.executable, "-c", textwrap.dedent(RANK), str(runs)], cwd=Path(__file__).parents[2])
    try:
        deadline = time.monotonic() + 60
        while not read_progress(runs):
            assert time.monotonic() < deadline and rank.poll() is None
            time.sleep(0.05)
        yield rank
    finally:
        rank.kill()
        rank.wait()


def verdict_of(watch: HangWatch) -> str:
    """The watchdog run until it has ended the node (torchrun's pid stood for by 4242): its line."""
    watch.start(4242)
    deadline = time.monotonic() + 60
    while watch.verdict is None:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    watch.stop()
    return watch.verdict


@pytest.mark.parametrize("stopped", [False, True])
def test_a_hung_rank_is_asked_for_its_stack_named_and_ended(tmp_path: Path, stopped: bool) -> None:
    """A process standing for a rank that last moved a minute ago; stopped (SIGSTOP), it cannot write its stack."""
    runs = tmp_path / "launch"
    runs.mkdir()
    # A link planted where the stack is kept, on a volume others write: replaced, not written through.
    (tmp_path / "logs").mkdir()
    (tmp_path / "outside").write_text("untouched")
    (tmp_path / "logs" / "stacks-rank-0.txt").symlink_to(tmp_path / "outside")
    ended: list[int] = []
    with reporting_rank(runs) as rank:
        if stopped:
            rank.send_signal(subprocess.signal.SIGSTOP)  # type: ignore[attr-defined]
        watch = HangWatch(str(runs), 2, HangBound(30, 1800, tmp_path / "logs", "MLM_HANG_TIMEOUT"), ended.append, 2.0)
        verdict = verdict_of(watch)
    assert ended == [4242]
    # Local rank 1 never reported: it is the one named, whatever rank 0 did.
    assert verdict.startswith("hung: no progress for 30 s (MLM_HANG_TIMEOUT=30): local rank 1 stopped;")
    if stopped:
        assert verdict.endswith("; no rank wrote its stack")
    else:
        assert verdict.endswith(f"stacks in {tmp_path / 'logs'}/stacks-rank-N.txt")
        assert "in stuck_in_step_5" in (tmp_path / "logs" / "stacks-rank-0.txt").read_text()
        assert not (tmp_path / "logs" / "stacks-rank-0.txt").is_symlink()
    assert (tmp_path / "outside").read_text() == "untouched"


def test_with_several_nodes_a_node_whose_ranks_all_wait_says_another_may_hold_them(tmp_path: Path) -> None:
    """Measured with two nodes on loopback (hang@3:1, one rank each): both launchers ended their node within 22 s;
    node 0's rank, waiting in step 3's collective, stood out in nothing."""
    runs = tmp_path / "launch"
    runs.mkdir()
    with reporting_rank(runs):
        watch = HangWatch(str(runs), 1, HangBound(30, 1800, tmp_path / "logs"), lambda pid: None, 2.0, nodes=2)
        verdict = verdict_of(watch)
    assert "rank 0 (its last progress: training step 5) stopped (of 2 nodes: these may wait for another node's" in (
        verdict
    )
