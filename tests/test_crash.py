"""The one line a crash ends with: an exception's first line, a dead DataLoader worker, a silent peer, a rank the
agent reports killed."""

from __future__ import annotations

from pathlib import Path

from train.common.errors import EXIT_CRASH, EXIT_ENVIRONMENT, first_line, signal_named
from train.launch.torchrun import killed_rank
from train.outputs.runfiles import RunFiles
from train.run.crash import collective_timeout, unexpected, worker_death


def test_first_line() -> None:
    assert first_line(ValueError("\n\n  bad value  \nmore detail")) == "bad value"
    assert first_line(ValueError("")) == "ValueError"  # nothing said: no IndexError
    assert first_line(KeyError("The metric is missing")) == "The metric is missing"  # not its repr
    assert first_line(KeyError("x", "y")) == "('x', 'y')"
    assert first_line(RuntimeError("x" * 500), limit=10) == "x" * 10


def test_a_worker_killed_by_the_oom_killer() -> None:
    exc = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")
    found = worker_death(exc)
    assert found is not None and found.exit_code == EXIT_ENVIRONMENT
    assert str(found).startswith("a DataLoader worker was killed (SIGKILL, pid 4242): most often the out-of-memory")
    assert "MLM_DATALOADER_NUM_WORKERS" in str(found)
    bus = worker_death(RuntimeError("DataLoader worker (pid 7) is killed by signal: Bus error. "))
    assert bus is not None and "(SIGBUS, pid 7)" in str(bus) and "/dev/shm" in str(bus)
    gone = worker_death(RuntimeError("DataLoader worker (pid(s) 12, 13) exited unexpectedly"))
    assert gone is not None and "exited unexpectedly (pid 12, 13)" in str(gone)
    assert worker_death(RuntimeError("CUDA out of memory")) is None
    assert signal_named("Killed") == "SIGKILL" and signal_named("Something else") == "Something else"


def test_a_collective_that_timed_out_names_the_option() -> None:
    for said in ("Application timeout caused pair closure", "[gloo/x.cc:78] Timed out waiting 10000ms for recv",
                 "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5)"):  # fmt: skip
        found = collective_timeout(RuntimeError(said), "MLM_DDP_TIMEOUT", 10)
        assert found is not None and found.exit_code == EXIT_CRASH
        assert str(found).startswith("no answer from another rank for MLM_DDP_TIMEOUT=10 s")
    assert collective_timeout(RuntimeError("Connection closed by peer"), "MLM_DDP_TIMEOUT", 10) is None


def test_an_unexpected_exception_keeps_its_traceback_in_the_rank_log(tmp_path: Path) -> None:
    try:
        raise TypeError("unsupported operand\nsecond line")
    except TypeError as exc:
        found = unexpected(exc, RunFiles(tmp_path), rank=3)
    log = RunFiles(tmp_path).crash_log(3)
    assert str(found) == f"rank 3 crashed: TypeError: unsupported operand; traceback in {log}"
    assert found.exit_code == EXIT_CRASH and "Traceback (most recent call last)" in log.read_text()
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where output_dir should be")
    assert "MLM_DEBUG=1 shows the traceback" in str(unexpected(ValueError("x"), RunFiles(blocked), rank=0))


REPORT = b"""torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.run.job FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_06:40:06
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 18168)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 18168
============================================================
"""


def test_the_agents_report_of_a_killed_rank_becomes_one_line() -> None:
    assert killed_rank(REPORT) == (
        "rank 1 was killed (SIGKILL): most often the out-of-memory killer - raise the memory limit or lower the "
        "batch size; checkpoints saved before are intact"
    )
    assert "rank 1 was killed (SIGSEGV): check the machine's logs" in str(killed_rank(REPORT.replace(b"-9", b"-11")))
    assert killed_rank(REPORT.replace(b"exitcode  : -9", b"exitcode  : 1")) is None  # an exit, not a signal
    assert killed_rank(b"") is None
