"""Preemption and crashes through the real front door (./entrypoint.sh -> launcher -> torchrun -> ranks)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import tiny_env
from tests.e2e.runs import (
    GROWING_BATCH,
    RESUMABLE,
    SCHEDULED_MASKING,
    batch_rows,
    continues,
    entrypoint,
    is_descendant,
    launcher_here,
    logged_losses,
    mask_rates,
    rank_pids,
    records,
    running,
    start,
    wait_for,
)
from tests.helpers import Payload
from train.common.schedules import BatchWarmup
from train.outputs.marker import mark_complete
from train.outputs.runfiles import OPTIONS_NAME

pytestmark = pytest.mark.slow
# The stops, kills and launches are real; what follows them and is not about processes (a resume, a refusal by the
# job or by the launcher before torchrun) runs the job's or the launcher's main() in this process, whose libraries
# are imported already: each launch spends seconds of CPU starting up, the tiny runs train for a second.
# The test marked alone works to a deadline (two presses further apart than ONE_PRESS_S, closer than a step): make
# test runs it one at a time, beside nothing. The others wait for what they need (a checkpoint, the evaluation's
# record) and then signal; beside another run they only take longer, with bounds far above that.


def test_sigterm_saves_resumes_and_ends_with_identical_weights(tmp_path: Path) -> None:
    """Under a mask rate schedule and a batch warm-up, on a mixture of two corpora: the resumed steps mask at the
    rates and train the rows the uninterrupted run's did, the mixture is rebuilt from the seed, and each evaluation
    has a loss per source."""
    legal = tmp_path / "legal.txt"
    legal.write_text(
        "".join(f"the licensee may copy and modify the work under clause {i} of this licence\n" for i in range(200))
    )
    options = {
        **RESUMABLE, **SCHEDULED_MASKING, **GROWING_BATCH, "demo_samples": "1000", "dataset": f"demo=0.6,{legal}=0.4"
    }  # fmt: skip
    straight = entrypoint(env=tiny_env(tmp_path / "a", **options))
    assert straight.returncode == 0, straight.stderr[-3000:]

    output = tmp_path / "b"
    env = tiny_env(output, **options)
    process = start(env=env)
    wait_for(output / "checkpoint-20" / ".complete", process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)  # a bound against a hang, not a measurement: speed is make bench's
    assert process.returncode == 75, stderr[-3000:]
    saved = [p for p in output.glob("checkpoint-*") if (p / ".complete").exists()]
    assert max(int(p.name.split("-")[1]) for p in saved) >= 20
    assert not (output / "final").exists()

    resumed = entrypoint(env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr
    assert "missing keys" not in resumed.stderr  # the tied output embedding is expected to be stored once
    first = (tmp_path / "a" / "final" / "model.safetensors").read_bytes()
    assert (output / "final" / "model.safetensors").read_bytes() == first
    rates = mask_rates(tmp_path / "a")
    assert mask_rates(output) == rates and len(rates) > 3, rates  # both sessions' records, the same rates
    total = next(r["step"] for r in records(tmp_path / "a" / "logs" / "train.jsonl") if r["event"] == "train_end")
    assert rates == {step: pytest.approx(0.3 + (0.1 - 0.3) * (step - 1) / total) for step in rates}
    rows = batch_rows(tmp_path / "a")
    assert batch_rows(output) == rows and rows == {
        step: BatchWarmup(16, 0.25, 0.5, 1).rows(step - 1, total) for step in rows
    }
    assert rows[min(rows)] < 16 == rows[max(rows)], rows  # growing, then whole
    mixture = json.loads((output / "run.json").read_text())["mixture"]
    assert [(m["key"], m["weight"]) for m in mixture] == [("demo", 0.6), ("legal", 0.4)]
    assert all(abs(m["share"] - m["weight"]) < 0.02 for m in mixture), mixture  # the token shares, as asked
    evaluations = [r for r in records(output / "logs" / "train.jsonl") if "eval_loss" in r]
    assert evaluations and all(r["eval_demo_loss"] > 0 and r["eval_legal_loss"] > 0 for r in evaluations)


def test_a_killed_rank_ends_the_job_without_hanging(tmp_path: Path) -> None:
    output = tmp_path / "out"
    process = start(env=tiny_env(output, nproc_per_node="2", **RESUMABLE))
    wait_for(output / "checkpoint-10" / ".complete", process)
    victims = rank_pids(process.pid)
    assert len(victims) == 2, victims
    os.kill(victims[1], signal.SIGKILL)
    _, stderr = process.communicate(timeout=180)  # raises if the job hangs
    assert process.returncode not in (0, 2, 3, 75)
    assert re.search(r"rank [01] was killed \(SIGKILL\)", stderr) and "ChildFailedError" not in stderr, stderr[-3000:]
    assert not (output / "final").exists()


def test_max_restarts_resume_from_the_last_checkpoint(tmp_path: Path) -> None:
    """A rank killed while a checkpoint is written in the background: checkpoint-30's first file written behind the
    loop (config.json) is a FIFO nobody reads, so its write stalls while training goes on past step 35. torchrun
    restarts the rank, which sets checkpoint-30 aside (its trainer_state.json held back) and resumes from
    checkpoint-20."""
    output = tmp_path / "out"
    process = start(env=tiny_env(output, max_restarts="1", logging_steps="5", **RESUMABLE))
    wait_for(output / "checkpoint-10" / ".complete", process)
    stalled = output / "checkpoint-30"
    stalled.mkdir()
    os.mkfifo(stalled / "config.json")
    log = output / "logs" / "train.jsonl"
    deadline = time.monotonic() + 300
    while not any(r["event"] == "train" and r["step"] >= 35 for r in records(log)):
        assert process.poll() is None and time.monotonic() < deadline, "training did not go on past step 35"
        time.sleep(0.2)
    assert (output / "checkpoint-20" / ".complete").exists()
    assert (stalled / "trainer_state.json.pending").exists() and not (stalled / "trainer_state.json").exists()
    victims = rank_pids(process.pid)
    assert victims
    os.kill(victims[0], signal.SIGKILL)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    assert "cannot resume from checkpoint-30 (no trainer_state.json" in stderr, stderr[-3000:]
    assert "resuming from checkpoint-20 instead" in stderr and "resuming from" in stderr
    assert (output / "final" / "model.safetensors").exists()


def test_a_stop_during_a_background_write_waits_for_it_and_saves_its_own(
    tmp_path: Path, job_in_process: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM lands while checkpoint-2 is still written behind the loop (its write held for 3 s): the stop's save
    waits for it, then saves checkpoint-3; both complete, exit 75, and the run resumes from the stop's checkpoint.
    The job's main() in this process (the signal is real, sent at step 3's end)."""
    from train.outputs import background

    write = background.BackgroundSaves._run
    held: list[int] = []

    def slowly(self: background.BackgroundSaves, save: background.BackgroundSave) -> None:
        if save.step == 2:
            held.append(save.step)
            time.sleep(3)
        write(self, save)

    monkeypatch.setattr(background.BackgroundSaves, "_run", slowly)
    output = tmp_path / "out"
    env = tiny_env(output, save_strategy="steps", save_steps="2", max_steps="6", logging_steps="1", eval_strategy="no")
    assert job_in_process(env, stop_at=3) == 75
    assert held == [2]  # the write was in flight when the signal came
    for step in (2, 3):
        assert (output / f"checkpoint-{step}" / ".complete").exists(), step
        assert (output / f"checkpoint-{step}" / "trainer_state.json").exists(), step
    assert json.loads((output / "run.json").read_text())["status"] == "preempted"
    assert job_in_process(env) == 0
    banners = [r for r in records(output / "logs" / "train.jsonl") if r["event"] == "banner"]
    assert [b["start_step"] for b in banners] == [0, 3]


# 1,500 evaluation samples one by one take seconds: a stop at step 20's evaluation lands inside it.
LONG_EVALUATION = {
    **RESUMABLE,
    "demo_samples": "3000",
    "validation_split_percentage": "50",
    "per_device_eval_batch_size": "1",
    "eval_strategy": "steps",
    "eval_steps": "10",
    "logging_steps": "10",
    "max_steps": "20",
}


def wait_for_evaluation_at_step_20(log: Path, process: subprocess.Popen) -> None:
    """The Trainer logs a step's record, then evaluates: step 20's record means its evaluation has begun."""
    wait_for(log, process)
    deadline = time.monotonic() + 300
    while not any(r["event"] == "train" and r["step"] == 20 for r in records(log)):
        assert process.poll() is None and time.monotonic() < deadline, "step 20 was never logged"
        time.sleep(0.1)


def newest_checkpoints(output: Path) -> list[Path]:
    return sorted(output.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))


# What a stop leaves on the console besides its one line: none of it.
STOP_NOISE = ("Traceback", "SignalException", "KeyboardInterrupt", "error: stopped")


def test_one_ctrl_c_under_timeout_during_a_long_evaluation_saves_without_finishing_it(
    tmp_path: Path, job_in_process: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C means what SIGTERM means. `timeout` re-sends the SIGINT its process group got to the launcher: two
    deliveries of one press, which must save and exit 75 as one press does, not abort as two presses do. Landing
    inside step 20's evaluation, the stop saves without finishing it, and the checkpoint resumes."""
    output = tmp_path / "out"
    env = tiny_env(output, **LONG_EVALUATION)
    log = output / "logs" / "train.jsonl"
    process = start(env=env, wrapper=["timeout", "900"], start_new_session=True)
    wait_for_evaluation_at_step_20(log, process)
    os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 75, stderr[-3000:]
    assert "second SIGINT" not in stderr and "stopped by SIGINT at step 20" in stderr
    for noise in STOP_NOISE:
        assert noise not in stderr, stderr[-3000:]
    assert [r["step"] for r in records(log) if r["event"] == "eval"] == [10]  # the interrupted one left no record
    assert (output / "checkpoint-20" / "trainer_state.json").exists()
    # Resumed at its last step: only the final evaluation is left, over fewer examples than the long one.
    capsys.readouterr()
    assert job_in_process({**env, "MLM_MAX_EVAL_SAMPLES": "32"}) == 0
    assert "resuming from" in capsys.readouterr().err and (output / "final" / "model.safetensors").exists()


@pytest.mark.alone
def test_a_second_ctrl_c_aborts_at_once(tmp_path: Path) -> None:
    output = tmp_path / "out"
    # Steps of 4 x 1,024 samples, each padded to 32 tokens, take long enough (seconds) that the second press lands
    # before the next step ends and saves: a stop takes effect at an optimizer step's end. (With the 13-token demo
    # rows padded only to the longest, and then with one micro-batch of 1,024 a step on torch 2.15, a step was short
    # enough that the ranks sometimes saved and exited 75 before the second press: a documented code the ranks
    # reported wins, so the launcher said 75.) 8 steps, a checkpoint every 2.
    slow_steps = {**RESUMABLE, "demo_samples": "40960", "per_device_train_batch_size": "1024",
                  "gradient_accumulation_steps": "4", "pad_to_multiple_of": "32", "save_steps": "2"}  # fmt: skip
    process = start(env=tiny_env(output, **slow_steps))
    wait_for(output / "checkpoint-2" / ".complete", process)
    ranks = rank_pids(process.pid)
    process.send_signal(signal.SIGINT)
    time.sleep(0.6)  # deliveries within ONE_PRESS_S are one press (a wrapper re-sending it); a person's is later
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr[-3000:]
    assert "second SIGINT: stopping at once" in stderr
    time.sleep(0.5)
    assert ranks and not [pid for pid in ranks if running(pid)]  # no rank left behind


def test_a_planted_pickle_runs_nothing_and_its_checkpoint_is_set_aside(
    tmp_path: Path, job_in_process: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hostile writer of the volume plants pickles and rewrites the markers to agree: one where the resume would
    unpickle it (the newest checkpoint's optimizer.pt), one in the file the Trainer never reads back (the older
    checkpoint's training_args.bin, the one resumed from). Nothing runs; the newest is set aside, named.
    The run is stopped as Slurm's --signal=USR1 stops it, which means what SIGTERM means: a checkpoint at the step
    it stopped, exit 75, one line (Ctrl-C's SIGINT: the evaluation test above)."""
    output = tmp_path / "out"
    env = tiny_env(output, **RESUMABLE)
    process = start(env=env)
    wait_for(output / "checkpoint-20" / ".complete", process)
    process.send_signal(signal.SIGUSR1)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 75, stderr[-3000:]
    *_, older, newest = newest_checkpoints(output)
    assert int(newest.name.split("-")[1]) > 20  # saved at the step it stopped
    said = re.search(r"mlm-trainer: stopped by SIGUSR1 at step (\d+); checkpoint saved as (\S+) in (\S+);", stderr)
    assert said and said[2] == newest.name == f"checkpoint-{said[1]}" and said[3] == str(output), stderr[-3000:]
    for noise in STOP_NOISE:
        assert noise not in stderr, stderr[-3000:]
    ran = tmp_path / "ran"
    torch.save({"state": Payload(ran)}, newest / "optimizer.pt")
    torch.save(Payload(ran), older / "training_args.bin")
    for path in (older, newest):
        mark_complete(path, json.loads((path / OPTIONS_NAME).read_text()))
    capsys.readouterr()
    resumed = job_in_process(env)  # here: a pickle that ran would leave its file all the same
    said = capsys.readouterr().err
    assert resumed == 0, said[-3000:]
    assert f"cannot resume from {newest.name} (optimizer.pt: fails the safe load" in said
    assert f"resuming from {older.name} instead" in said
    assert (output / "final" / "model.safetensors").exists() and not ran.exists()


def test_a_two_rank_run_resumed_on_one_keeps_its_global_batch(
    tmp_path: Path, job_in_process: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Capacity changed between the stop and the resume: the global batch (16) is kept by accumulating, said in
    one line, the epoch count goes on from where it was, and the losses go on as the uninterrupted run's (within
    2 %: the same weights and optimizer state, the examples in another order). The two-rank runs and the stop are
    real; the one-rank resume is the job's main() in this process."""
    output = tmp_path / "out"
    options = {
        **RESUMABLE, **SCHEDULED_MASKING, **GROWING_BATCH, "demo_samples": "800", "per_device_train_batch_size": "8",
        "logging_steps": "5",
    }  # fmt: skip
    straight = entrypoint(env=tiny_env(tmp_path / "straight", nproc_per_node="2", **options))
    assert straight.returncode == 0, straight.stderr[-3000:]
    # Healthy: each rank's own time in every record, and no straggler named over its 8 records.
    assert json.loads((tmp_path / "straight" / "run.json").read_text())["stragglers"] == []
    trained = [r for r in records(tmp_path / "straight" / "logs" / "train.jsonl") if r["event"] == "train"]
    assert len(trained) == 8 and all({"rank_step_s/0", "rank_step_s/1"} <= r.keys() for r in trained)
    process = start(env=tiny_env(output, nproc_per_node="2", **options))
    wait_for(output / "checkpoint-10" / ".complete", process)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == 75
    capsys.readouterr()
    resumed = job_in_process(tiny_env(output, nproc_per_node="1", **options))
    said = capsys.readouterr().err
    assert resumed == 0, said[-3000:]
    assert "keeping its global batch, 1 rank(s) x 8 per device x 2 accumulation step(s)" in said
    log = records(output / "logs" / "train.jsonl")
    assert [r["global_batch_size"] for r in log if r["event"] == "banner"] == [16, 16]
    epochs = [r["epoch"] for r in log if r["event"] == "train"]
    assert epochs == sorted(epochs) and epochs[-1] == pytest.approx(1.0, abs=0.05), epochs
    # Each logged loss averages the 5 steps before it: compare those whose steps were all trained after the resume.
    stop = int(re.findall(r"resuming from \S+/checkpoint-(\d+)", said)[0])
    second = max(i for i, r in enumerate(log) if r["event"] == "banner")
    whole = {
        r["step"]: r["loss"] for r in log[second:] if r["event"] == "train" and "loss" in r and r["step"] - 5 >= stop
    }
    uninterrupted = logged_losses(tmp_path / "straight")
    continues(whole, uninterrupted, [step for step in sorted(uninterrupted) if step - 5 >= stop])
    assert mask_rates(output) == mask_rates(tmp_path / "straight")  # on one rank, the steps' rates as on two
    assert batch_rows(output) == batch_rows(tmp_path / "straight")  # and the same global rows


def test_a_second_job_on_the_same_output_dir_is_refused_and_the_first_is_unharmed(
    tmp_path: Path, job_in_process: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "out"
    env = tiny_env(output, **{**RESUMABLE, "demo_samples": "32000"})  # 1,600 steps: still running meanwhile
    first = start(env=env)
    wait_for(output / "checkpoint-10" / ".complete", first)
    capsys.readouterr()
    # The second job's rank 0 here: the lease it is refused is held by the first's, a process of this host.
    second = job_in_process(env)
    said = capsys.readouterr().err
    assert second == 3, said[-3000:]
    errors = [line for line in said.splitlines() if line.startswith("mlm-trainer: error:")]
    assert len(errors) == 1 and "is in use by another run (pid" in errors[0], said[-3000:]
    assert first.poll() is None  # the first trains on
    first.send_signal(signal.SIGTERM)
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 75, stderr[-3000:]
    assert "cannot resume" not in stderr and not (output / ".lease").exists()
    assert [p.name for p in output.iterdir() if p.name.startswith(".invalid-")] == []  # nothing of it moved aside


def test_a_diverged_run_publishes_nothing(
    tmp_path: Path, job_in_process: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "out"
    env = tiny_env(output, learning_rate="1e30", logging_steps="5", save_strategy="steps", save_steps="5")
    capsys.readouterr()
    diverged = job_in_process(env)
    said = capsys.readouterr().err
    assert diverged == 2, said[-3000:]
    assert "training diverged at step 5" in said and "final/ was not written" in said
    assert not (output / "final").exists() and not list(output.glob("checkpoint-*"))
    assert json.loads((output / "run.json").read_text())["status"] == "diverged"


CANARY = "hf_canary_flag_0123456789"


@dataclass
class Ended:
    """What a run given a token as a flag showed: its processes' command lines while it trained, its output, and
    whether a SIGTERM reached it after run.json said "finished" (before it exited)."""

    output: Path
    family: list[int]
    seen: list[tuple[int, bytes]]
    signalled_late: bool
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def token_run_stopped_late(tmp_path_factory: pytest.TempPathFactory) -> Ended:
    """One launch for two facts that one run shows (a launch's start-up is the most of a tiny run's cost): a token
    given as a flag, looked for while it trains; then, as a pod deleted while its run ends, a SIGTERM that lands
    once run.json says "finished" while the rank and torchrun are still shutting down."""
    output = tmp_path_factory.mktemp("token") / "out"
    process = start("train", "--hub_token", CANARY, env=tiny_env(output, log_format="text", **RESUMABLE))
    wait_for(output / "checkpoint-10" / ".complete", process)
    family = [process.pid, *[p for p in rank_pids(process.pid)]]
    seen = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and is_descendant(int(proc.name), process.pid):
            try:
                seen.append((int(proc.name), (proc / "cmdline").read_bytes()))
            except OSError:
                continue
    run = output / "run.json"
    while process.poll() is None:
        try:
            if json.loads(run.read_text())["status"] == "finished":
                break
        except (OSError, ValueError, KeyError):
            pass  # not written yet, or being replaced
        time.sleep(0.02)
    signalled_late = process.poll() is None
    if signalled_late:
        process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=600)
    return Ended(output, family, seen, signalled_late, process.returncode, stdout, stderr)


def test_a_token_given_as_a_flag_reaches_no_file_and_no_command_line(token_run_stopped_late: Ended) -> None:
    ended = token_run_stopped_late
    assert ended.returncode == 0, ended.stderr[-3000:]
    seen = ended.seen
    assert len(seen) >= 3 and set(ended.family) <= {pid for pid, _ in seen}  # launcher, torchrun, the rank
    assert not [pid for pid, cmdline in seen if CANARY.encode() in cmdline]
    assert CANARY not in ended.stdout + ended.stderr
    files = [path for path in ended.output.rglob("*") if path.is_file()]
    assert any(path.name == "training_args.bin" for path in files)  # the Trainer's pickle of its arguments
    assert not [path for path in files if CANARY.encode() in path.read_bytes()]  # logs/train.jsonl's records too


@pytest.fixture
def small_mount(tmp_path: Path):
    """A real 5 MiB filesystem: room for the write probe and the logs, not for a checkpoint."""
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root and mount rights)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_disk_that_fills_while_checkpointing_is_exit_3_in_one_line(
    small_mount: Path, job_in_process: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    env = tiny_env(small_mount / "out", **RESUMABLE)
    capsys.readouterr()
    result = job_in_process(env)
    said = capsys.readouterr().err
    assert result == 3, said[-3000:]
    errors = [line for line in said.splitlines() if line.startswith("mlm-trainer: error:")]
    assert len(errors) == 1 and "no space left on the device while writing" in errors[0], said[-3000:]
    assert "Traceback" not in said
    assert not (small_mount / "out" / "final").exists()


def test_an_unwritable_hf_home_is_exit_3_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = tiny_env(tmp_path / "out")
    env["HF_HOME"] = str(blocker / "hf")  # under a file: not creatable, even for root
    code, said = launcher_here(capsys, env)  # refused before torchrun: the launcher's main() here
    assert code == 3, said[-3000:]
    errors = [line for line in said.splitlines() if line.startswith("mlm-trainer: error:")]
    assert len(errors) == 1 and errors[0].startswith(f"mlm-trainer: error: HF_HOME='{blocker / 'hf'}': not writable")


def test_a_sigterm_after_the_run_finished_is_no_crash(token_run_stopped_late: Ended) -> None:
    """A pod deleted as its run ends: the stop signal lands once run.json says "finished", while the rank and
    torchrun are still shutting down (torchrun, signalled, exits 1 whatever its ranks did). The launcher exits 0
    with no error line and no traceback: the rank recorded that it finished."""
    ended = token_run_stopped_late
    assert ended.signalled_late, "the run had exited before the signal: the case was not tried"
    assert ended.returncode == 0, ended.stderr[-3000:]
    assert "error" not in ended.stderr.lower() and "Traceback" not in ended.stderr, ended.stderr[-3000:]
