"""Running torchrun: its environment, exit-code translation, signal forwarding; and the real entry points."""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.launch.common import PYTORCHJOB
from train.config import load_config
from train.launch import plan as planning
from train.launch import torchrun
from train.launch.inputs import Host
from train.machine import gpus


@pytest.fixture
def cpu_plan(no_nvml, tmp_path) -> planning.Plan:
    config = load_config([], {"MLM_OUTPUT_DIR": str(tmp_path / "out")})
    return planning.make_plan(config, Host(gpus.detect({})), {}, [])


def fake_torchrun(plan: planning.Plan, script: str) -> planning.Plan:
    return dataclasses.replace(plan, command=[sys.executable, "-c", script])


def test_child_env_drops_pet_variables_and_sets_the_decisions(cpu_plan):
    env = torchrun._child_env({"PET_STANDALONE": "", "PET_NNODES": "2", "KEEP": "1"}, cpu_plan, "/x")
    assert not [k for k in env if k.startswith("PET_")]
    assert env["KEEP"] == "1" and env["MLM_EXIT_DIR"] == "/x"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["CUDA_VISIBLE_DEVICES"] == ""


RECORD = "import os, sys; open(os.path.join(os.environ['MLM_EXIT_DIR'], 'rank-{rank}.exit'), 'w').write('{code}'); "


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("import sys; sys.exit(0)", 0),
        (RECORD.format(rank=1, code=75) + "sys.exit(1)", 75),  # a preempted rank: torchrun says 1, we say 75
        (RECORD.format(rank=0, code=2) + "sys.exit(1)", 2),
        (RECORD.format(rank=3, code=3) + "sys.exit(1)", 3),
        ("import sys; sys.exit(1)", 1),  # a crash: no documented code
        # every rank finished after a stop signal (a budget's plan fitted the window): torchrun says 1, we say 0
        (RECORD.format(rank=0, code=0) + "sys.exit(1)", 0),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137),
    ],
)
def test_exit_codes_are_translated(cpu_plan, script, expected):
    assert torchrun.launch(fake_torchrun(cpu_plan, script), {}, lambda *a: None, 10) == expected


def test_a_finish_after_a_stop_needs_every_rank_of_the_node(cpu_plan):
    two = dataclasses.replace(cpu_plan, nproc_per_node=2)
    one_finished = fake_torchrun(two, RECORD.format(rank=0, code=0) + "sys.exit(1)")  # the other died unrecorded
    assert torchrun.launch(one_finished, {}, lambda *a: None, 10) == 1


def test_sigterm_is_forwarded_to_torchrun(cpu_plan, tmp_path):
    ready = tmp_path / "ready"
    script = (
        "import os, signal, sys, time\n"
        "def stop(signum, frame):\n"
        "    open(os.path.join(os.environ['MLM_EXIT_DIR'], 'rank-0.exit'), 'w').write('75')\n"
        "    sys.exit(1)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "time.sleep(60)\n"
        "sys.exit(9)\n"
    )

    def terminate_when_ready():
        for _ in range(600):
            if ready.exists():
                os.kill(os.getpid(), signal.SIGTERM)  # as docker stop / the kubelet would, to the launcher
                return
            time.sleep(0.05)

    logged = []
    before = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=terminate_when_ready, daemon=True).start()
    assert torchrun.launch(fake_torchrun(cpu_plan, script), {}, lambda m, *a: logged.append(m), 10) == 75
    assert any("SIGTERM received: passing it to torchrun" in m for m in logged)
    assert signal.getsignal(signal.SIGTERM) == before  # the launcher's handler is gone once torchrun is


def test_torchrun_runs_as_a_fork_set_up_like_a_new_process(tmp_path):
    """The real torchrun, in a fork of this process: its own group, the given environment handed to its rank,
    none of this process's atexit handlers, and torchrun's exit status (1 for a failed rank, with its report)."""
    seen = tmp_path / "rank.json"
    rank = (
        "import json, os, sys; "
        f"json.dump([os.environ.get('KEEP'), os.environ.get('DROPPED'), os.getppid()], open({str(seen)!r}, 'w')); "
        "sys.exit(3)"
    )
    launcher_exit = tmp_path / "launcher-atexit"
    atexit.register(launcher_exit.write_text, "ran")
    os.environ["DROPPED"] = "launcher's"
    try:
        child = torchrun.start_torchrun(
            [*planning.torchrun_path(), "--standalone", "--nproc-per-node", "1", "--no-python", sys.executable,
             "-c", rank],
            {"PATH": os.environ["PATH"], "KEEP": "1"},
        )  # fmt: skip
        assert isinstance(child, torchrun.ForkedTorchrun)
        assert os.getpgid(child.pid) == child.pid
        report = child.stderr.read()
        assert child.wait() == 1
    finally:
        atexit.unregister(launcher_exit.write_text)
        del os.environ["DROPPED"]
    assert json.loads(seen.read_text()) == ["1", None, child.pid]
    assert b"ChildFailedError" in report
    assert not launcher_exit.exists()


def test_a_forked_torchrun_exits_as_the_command_would_on_bad_arguments():
    child = torchrun.start_torchrun([*planning.torchrun_path(), "--standalone"], {"PATH": os.environ["PATH"]})
    assert b"the following arguments are required: training_script" in child.stderr.read()
    assert child.wait() == 2


@pytest.mark.parametrize(
    ("ending", "status", "says"),
    [
        (KeyboardInterrupt, -signal.SIGINT, b"KeyboardInterrupt"),  # a Ctrl-C before torchrun's handlers are in place
        (SystemExit("no good"), 1, b"no good"),
        (SystemExit(None), 0, b""),
        (RuntimeError("broken"), 1, b"RuntimeError: broken"),
    ],
)
def test_a_forked_torchrun_ends_as_python_would_end_the_command(monkeypatch, ending, status, says):
    """What the torchrun command's exit status would be when its main ends this way (the forked child runs the
    main it finds in torch.distributed.run, here one that ends so)."""
    import torch.distributed.run

    def main(arguments):
        raise ending

    monkeypatch.setattr(torch.distributed.run, "main", main)
    child = torchrun.start_torchrun([*planning.torchrun_path(), "--standalone"], {"PATH": os.environ["PATH"]})
    assert says in child.stderr.read()
    assert child.wait() == status


def test_other_commands_run_as_they_are(cpu_plan):
    child = torchrun.start_torchrun([sys.executable, "-c", "import sys; sys.exit(4)"], {})
    assert isinstance(child, subprocess.Popen) and child.wait() == 4


# ---- through the real entry points ---------------------------------------------------------------------------------


def entry_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLM_", "PET_"))}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", **extra)
    env["MLM_OUTPUT_DIR"] = str(tmp_path / "out")
    return env


def test_entrypoint_plan_for_a_pytorchjob_worker(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    # A PyTorchJob pod also carries WORLD_SIZE/RANK; with use_cpu the launcher's own TrainingArguments would
    # start a process group with them and wait forever for rank 0 (the launcher must load the config as a launcher).
    worker = {**PYTORCHJOB, "PET_NODE_RANK": "1", "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    env = entry_env(tmp_path, **worker, MLM_USE_CPU="true")
    result = subprocess.run(
        [str(REPO / "entrypoint.sh"), "plan"], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    document = json.loads(result.stdout)
    assert (document["nnodes"], document["node_rank"], document["backend"]) == (2, 1, "gloo")
    assert "--node-rank" in document["command"] and document["config"]["use_cpu"] is True


def test_entrypoint_gpus_without_a_driver(tmp_path):
    result = subprocess.run(
        [str(REPO / "entrypoint.sh"), "gpus"], env=entry_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("no GPU visible: CPU mode (")


def test_the_entrypoint_withholds_every_secret_option():
    """entrypoint.sh moves secret flags out of the launcher's own command line; its list is the schema's."""
    from train.config import SECRET_FIELDS

    script = (REPO / "entrypoint.sh").read_text()
    for name in SECRET_FIELDS:
        assert f"--{name})" in script and f"--{name}=*)" in script and f"MLM_{name.upper()}=" in script


SECRET_VARS = ("HF_TOKEN", "WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "AWS_ACCESS_KEY_ID",
               "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")  # fmt: skip


def test_every_secret_can_come_from_a_mounted_file(tmp_path):
    """VAR_FILE fills VAR (the trailing newline a Secret's file often has dropped) and is itself unset; both set
    is exit 2 naming both."""
    listed = re.search(r"^SECRET_VARS=\(([^)]*)\)", (REPO / "entrypoint.sh").read_text(), re.M)
    assert listed and tuple(listed[1].split()) == SECRET_VARS  # the list this test goes through is the script's
    files = {}
    for name in SECRET_VARS:
        files[f"{name}_FILE"] = str(tmp_path / name.lower())
        Path(files[f"{name}_FILE"]).write_text(f"value of {name}\n")
    show = "; ".join(f'printf "%s|%s\\n" "${name}" "${{{name}_FILE-unset}}"' for name in SECRET_VARS)
    result = subprocess.run(
        [str(REPO / "entrypoint.sh"), "bash", "-c", show], env=entry_env(tmp_path, **files), capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"value of {name}|unset" for name in SECRET_VARS]

    both = entry_env(tmp_path, WANDB_API_KEY="inline", WANDB_API_KEY_FILE=files["WANDB_API_KEY_FILE"])
    result = subprocess.run([str(REPO / "entrypoint.sh"), "true"], env=both, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "both WANDB_API_KEY and WANDB_API_KEY_FILE are set" in result.stderr
    for wrong, says in [
        (tmp_path / "absent", "no such readable file; expected a file holding AWS_SECRET_ACCESS_KEY"),
        (tmp_path, "no such readable file; expected a file holding AWS_SECRET_ACCESS_KEY"),  # the mount, not its key
        (write(tmp_path / "empty", "\n"), "the file is empty; expected it to hold AWS_SECRET_ACCESS_KEY"),
    ]:
        env = entry_env(tmp_path, AWS_SECRET_ACCESS_KEY_FILE=str(wrong))
        result = subprocess.run(
            [str(REPO / "entrypoint.sh"), "true"], env=env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 2 and f"AWS_SECRET_ACCESS_KEY_FILE={wrong}: {says}" in result.stderr, result.stderr
    windows = entry_env(tmp_path, HF_TOKEN_FILE=str(write(tmp_path / "crlf", "hf_abc\r\n")))
    result = subprocess.run(
        [str(REPO / "entrypoint.sh"), "bash", "-c", 'printf "%s|" "$HF_TOKEN"'], env=windows, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.stdout == "hf_abc|"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_relay_drops_c10d_hostname_warnings_unless_debugging() -> None:
    """Every connection from a peer without reverse DNS (containers, network namespaces) logs one; JSON mode's
    stderr and a person's console get none of them. MLM_DEBUG=1 keeps them."""
    import io

    from train.launch.relay import StderrRelay

    noise = (
        b"[W1201 14:00:00.000000000 socket.cpp:767] [c10d] The hostname of the client socket cannot be retrieved. "
        b"err=-3\n"
    )
    for keep, expected in ((False, b"before\nafter\n"), (True, b"before\n" + noise + b"after\n")):
        sink = io.BytesIO()
        relay = StderrRelay(sink, keep_noise=keep)
        relay.feed(b"before\n" + noise + b"after\n")
        relay.finish(drop_report=True)
        assert sink.getvalue() == expected


def test_the_relay_drops_the_leak_report_of_a_rank_that_froze_its_objects() -> None:
    """A rank the launcher started leaves its objects to the operating system at exit (gc.freeze); triton's
    bindings then print nanobind's leak report after the rank's last word. The relay drops it; MLM_DEBUG=1 keeps it."""
    import io

    from train.launch.relay import StderrRelay

    report = (
        b"nanobind: leaked 4 instances!\n"
        b' - leaked instance 0x7fe0f55c53a8 of type "triton._C.libtriton.ir.attribute"\n'
        b"nanobind: leaked 64 types!\n"
        b' - leaked type "triton._C.libtriton.ir.location"\n'
        b" - ... skipped remainder\n"
        b"nanobind: this is likely caused by a reference counting issue in the binding code.\n"
        b"See https://nanobind.readthedocs.io/en/latest/refleaks.html"  # the last line has no newline
    )
    last = b"mlm-trainer: finished: model in /out/final\n"
    for keep, expected in ((False, last), (True, last + report)):
        sink = io.BytesIO()
        relay = StderrRelay(sink, keep_noise=keep)
        relay.feed(last + report)
        relay.finish(drop_report=True)
        assert sink.getvalue() == expected
    # A crashed rank's report, then torchrun's, glued to the report's last line: the agent's report is still held
    # back (the rank said in one line what went wrong), and arriving in pieces changes nothing.
    agent = b"E1206 02:36:24.862000 23312 /venv/torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1)\n"
    stream = (
        b"mlm-trainer: error: rank 0 crashed: KeyError\n" + report + agent + b"Traceback (most recent call last):\n"
    )
    for size in (len(stream), 7):
        sink = io.BytesIO()
        relay = StderrRelay(sink)
        for at in range(0, len(stream), size):
            relay.feed(stream[at : at + size])
        assert relay.reporting
        relay.finish(drop_report=True)
        assert sink.getvalue() == b"mlm-trainer: error: rank 0 crashed: KeyError\n"


def test_a_held_signal_traceback_does_not_hold_back_the_lines_after_it() -> None:
    """Under Slurm torchrun gets SIGTERM twice; its SignalException traceback is dropped, the rank's one line
    that comes after it is not."""
    import io

    from train.launch.relay import StderrRelay

    sink = io.BytesIO()
    relay = StderrRelay(sink)
    relay.feed(
        b'--- Logging error ---\nTraceback (most recent call last):\n  File "api.py", line 1, in _poll\n'
        b"torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got signal: 15\n"
        b"mlm-trainer: stopped by SIGTERM at step 13; checkpoint saved as checkpoint-13 in /out\n"
    )
    relay.finish(drop_report=True)
    out = sink.getvalue()
    assert b"SignalException" not in out
    assert out.endswith(b"mlm-trainer: stopped by SIGTERM at step 13; checkpoint saved as checkpoint-13 in /out\n")


def test_a_chain_of_tracebacks_that_ends_in_the_stop_signal_is_held_back_whole() -> None:
    """torch 2.15's agent, signalled again while it logs (a logging cache miss, KeyError), prints a chain of
    tracebacks whose last exception is its SignalException: all of it is torchrun's, none of it news. A chain that
    ends in another exception is shown whole."""
    import io

    from train.launch.relay import StderrRelay

    inner = (
        b"Traceback (most recent call last):\n"
        b'  File "/usr/lib/python3.11/logging/__init__.py", line 1742, in isEnabledFor\n'
        b"    return self._cache[level]\n"
        b"KeyError: 30\n"
        b"\n"
        b"During handling of the above exception, another exception occurred:\n"
        b"\n"
        b"Traceback (most recent call last):\n"
        b'  File "api.py", line 1, in _poll\n'
    )
    signal = b"torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got signal: 15\n"
    after = b"mlm-trainer: exit 75, as the ranks reported (see the line above)\n"
    for last, shown in ((signal, False), (b"RuntimeError: something else\n", True)):
        for tail in (after, b""):  # the next line ends the chain, or the end of the output does
            sink = io.BytesIO()
            relay = StderrRelay(sink)
            relay.feed(b"before\n" + inner + last + tail)
            relay.finish(drop_report=True)
            assert sink.getvalue() == b"before\n" + (inner + last if shown else b"") + tail
