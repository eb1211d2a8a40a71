"""A hung rank ends the job in minutes (train/launch/watchdog.py): the launcher names the rank that stopped, keeps
every rank's stack, kills every process of the node and exits 76, which the cluster retries; the same command then
resumes. Two gloo ranks under the real launcher and torchrun, a tiny model on CPU."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import tiny_env
from tests.e2e.runs import entrypoint, rank_pids, records, start

pytestmark = pytest.mark.slow


def rank_of(pid: int) -> int:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(v for v in environ if v.startswith(b"RANK=")).split(b"=", 1)[1])


def ranks_left(output: Path) -> list[int]:
    """Processes of this run still alive anywhere (their launcher gone, they are no one's descendants)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"MLM_OUTPUT_DIR={output}".encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_a_hung_rank_then_a_stopped_one_end_the_job_with_76_and_the_same_command_resumes(tmp_path: Path) -> None:
    """The tiny run: 3 steps an epoch on two ranks, 3 epochs, a checkpoint every 2 steps, a 10 s bound; rank 1's
    steps three times as long all along (slow@1:3), which the last launch names as a straggler.
    1. hang@3:1: rank 1 sleeps at step 3's start; rank 0 waits for it in step 3's collective. Rank 1 is behind
       (rank 0 began step 3), so it is the one named; both wrote their stacks.
    2. The same command resumes from checkpoint-2 (the drill fired already); rank 1 is stopped from outside with
       SIGSTOP once step 3 is logged: it can neither move nor write its stack, and is named. Stopped in step 4, the
       node ends 10 s after; stopped while it saves checkpoint-4, after the save's bound (ddp_timeout 80 s less 30).
    3. The same command resumes again and finishes."""
    output = tmp_path / "out"
    env = tiny_env(
        output, nproc_per_node="2", inject_fault="hang@3:1,slow@1:3", hang_timeout="10", num_train_epochs="3",
        save_strategy="steps", save_steps="2", logging_steps="1", log_format="text", ddp_timeout="80",
    )  # fmt: skip
    hung = entrypoint(env=env, timeout=240)
    assert hung.returncode == 76, hung.stderr[-3000:]
    line = next(x for x in hung.stderr.splitlines() if "hung: no progress" in x)
    assert (
        "no progress for 10 s (MLM_HANG_TIMEOUT=10): rank 1 (its last progress: saved a checkpoint at step 2)" in line
    )
    assert "rank 0" not in line and f"stacks in {output}/logs/stacks-rank-N.txt" in line
    assert "exit 76: run the same command to resume" in line
    assert "drills.py" in (output / "logs" / "stacks-rank-1.txt").read_text()  # where it sleeps
    assert "File " in (output / "logs" / "stacks-rank-0.txt").read_text()  # where it waits
    assert ranks_left(output) == []
    assert json.loads((output / "faults-fired.json").read_text())["fired"] == ["hang@3:1"]

    resumed = start(env=env)
    log = output / "logs" / "train.jsonl"
    deadline = time.monotonic() + 180
    while not any(r.get("step") == 3 and "loss" in r for r in records(log)):
        assert resumed.poll() is None, resumed.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "step 3 was not logged"
        time.sleep(0.2)
    (rank_1,) = [pid for pid in rank_pids(resumed.pid) if rank_of(pid) == 1]
    os.kill(rank_1, signal.SIGSTOP)
    _, err = resumed.communicate(timeout=180)
    assert resumed.returncode == 76, err[-3000:]
    line = next(x for x in err.splitlines() if "hung: no progress" in x)
    assert "rank 1 (its last progress: " in line and "rank 0" not in line, line
    assert ranks_left(output) == []

    finished = entrypoint(env=env, timeout=240)
    assert finished.returncode == 0, finished.stderr[-3000:]
    run = json.loads((output / "run.json").read_text())
    assert run["status"] == "finished"
    assert (output / "final" / "model.safetensors").exists()
    # slow@1:3 all along: rank 1, named once this launch had SLOW_RECORDS slow records after its first.
    (line,) = [x for x in finished.stderr.splitlines() if "straggler: " in x]
    assert "straggler: rank 1 spent" in line, line
    assert [s["rank"] for s in run["stragglers"]] == [1]
    last = records(log)
    last = last[max(i for i, r in enumerate(last) if r.get("event") == "banner") :]
    times = [r for r in last if r.get("event") == "train"][1:]  # the drill has no step before the first to scale
    assert times and all(r["rank_step_s/1"] > r["rank_step_s/0"] for r in times)
