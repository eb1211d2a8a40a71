"""One job per output directory: the lease is taken atomically, refused to a second job naming the holder, and
taken over when its holder is gone (same host: the process ended; another host: the heartbeat expired)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from train.common.errors import EnvironmentProblem
from train.outputs.lease import EXPIRY_S, OutputLease
from train.outputs.runfiles import RunFiles


def test_second_job_on_this_host_is_refused_and_the_first_keeps_its_lease(tmp_path):
    first = OutputLease(RunFiles(tmp_path), "MLM_OUTPUT_DIR")
    first.acquire()
    try:
        second = OutputLease(RunFiles(tmp_path), "MLM_OUTPUT_DIR")
        with pytest.raises(
            EnvironmentProblem, match=rf"MLM_OUTPUT_DIR='{tmp_path}' is in use by another run \(pid {os.getpid()} on "
        ):
            second.acquire(wait_s=60)  # a live holder on this host: no waiting
        assert json.loads(RunFiles(tmp_path).lease.read_text())["token"] == first.token
    finally:
        first.release()
    assert not RunFiles(tmp_path).lease.exists()


def test_a_lease_left_by_a_dead_process_is_taken_over(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = OutputLease(RunFiles(tmp_path), "x")
    left.record["pid"] = int(dead.stdout)  # the process is gone: its start time no longer reads
    RunFiles(tmp_path).lease.write_text(json.dumps(left.record))
    taker = OutputLease(RunFiles(tmp_path), "x")
    taker.acquire()
    assert json.loads(RunFiles(tmp_path).lease.read_text())["token"] == taker.token
    taker.release()


def test_another_hosts_lease_expires_without_a_heartbeat(tmp_path):
    other = {"token": "t", "host": "node-elsewhere", "pid": 1, "start_time": "1", "started": "then"}
    RunFiles(tmp_path).lease.write_text(json.dumps(other))
    now = [os.stat(RunFiles(tmp_path).lease).st_mtime]
    waited: list[float] = []

    def sleep(seconds: float) -> None:
        waited.append(seconds)
        now[0] += seconds

    fresh = OutputLease(RunFiles(tmp_path), "MLM_OUTPUT_DIR", clock=lambda: now[0])
    with pytest.raises(EnvironmentProblem, match="pid 1 on node-elsewhere"):
        fresh.acquire(wait_s=5, sleep=sleep)  # renewed recently, and the wait is shorter than the expiry
    assert sum(waited) >= 5
    expired = OutputLease(RunFiles(tmp_path), "MLM_OUTPUT_DIR", clock=lambda: now[0])
    expired.acquire(wait_s=EXPIRY_S * 2, sleep=sleep)  # the holder's node is gone: no heartbeat, taken over
    assert json.loads(RunFiles(tmp_path).lease.read_text())["token"] == expired.token
    expired.release()
