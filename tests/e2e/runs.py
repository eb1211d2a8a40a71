"""Starting end-to-end runs through the front door (./entrypoint.sh -> launcher -> torchrun -> ranks) and watching
them: the one launch helper (:func:`entrypoint`, :func:`start` for a run to signal or kill, :func:`launcher_here`
for a refusal before torchrun), the processes of a run, and the environments shared by several test modules.
Fixtures live in tests/e2e/conftest.py."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, tiny_env
from tests.hub_server import USER, HubServer

ENTRYPOINT = REPO / "entrypoint.sh"

# 1,600 demo samples in batches of 16: 80 steps, a checkpoint every 10, no dataloader workers.
RESUMABLE = {"demo_samples": "1600", "per_device_train_batch_size": "16", "save_strategy": "steps", "save_steps": "10"}
# A mask rate falling from 30 % to 10 % over the run, logged every 10 steps
SCHEDULED_MASKING = {"mlm_probability": "0.3", "final_mlm_probability": "0.1", "logging_steps": "10"}
# A global batch growing from a quarter of its rows to all of them over the first half of the run
GROWING_BATCH = {"batch_warmup_ratio": "0.5"}


def entrypoint(
    *args: str,
    env: dict[str, str],
    cwd: Path | None = None,
    timeout: float | None = 600,
    wrapper: Sequence[str] = (),
) -> subprocess.CompletedProcess:
    """``./entrypoint.sh ARGS`` run to its end (``wrapper``: a command it runs under, such as ``setpriv ...``);
    its output captured as text, its exit code not checked."""
    return subprocess.run(
        [*wrapper, str(ENTRYPOINT), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def launcher_here(capsys: Any, env: dict[str, str], *args: str) -> tuple[int, str]:
    """The launcher's main() in this process, as ./entrypoint.sh would run it with ``args`` and ``env``: its exit
    code and what it wrote to stderr. For the refusals, which end before torchrun (a launch's start-up is seconds;
    a store's client reads its AWS_* variables from this process's environment: set them too)."""
    from train.common.errors import run_main
    from train.launch.__main__ import main as launcher

    capsys.readouterr()
    code = run_main(lambda argv: launcher(argv, env), list(args))
    return code, capsys.readouterr().err


def start(*args: str, env: dict[str, str], wrapper: Sequence[str] = (), **popen: Any) -> subprocess.Popen:
    """``./entrypoint.sh ARGS`` started, for a test to signal, kill or wait for: stdout and stderr piped as text
    unless ``popen`` says otherwise (``stderr=subprocess.STDOUT``, ``cwd``, ``start_new_session``...)."""
    options: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **popen}
    return subprocess.Popen([*wrapper, str(ENTRYPOINT), *args], env=env, **options)


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    """Until ``path`` exists; fails if ``process`` exits first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, f"exited {process.returncode} before {path} appeared: {process.stderr.read()}"
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout} s"
        time.sleep(0.2)


def records(log: Path) -> list[dict]:
    """The complete lines of a train.jsonl that may still be being written."""
    return [json.loads(line) for line in log.read_text().splitlines(keepends=True) if line.endswith("\n")]


def logged_losses(output_dir: Path) -> dict[int, float]:
    """The training losses a run logged in its train.jsonl, by step."""
    return {r["step"]: r["loss"] for r in records(output_dir / "logs" / "train.jsonl") if "loss" in r}


def batch_rows(output: Path) -> dict[int, int]:
    """The global rows each training record of a run under a batch warm-up logged, by step (every session's)."""
    return {
        r["step"]: r["batch_rows"]
        for r in records(output / "logs" / "train.jsonl")
        if r.get("event") == "train" and "loss" in r
    }


def mask_rates(output: Path) -> dict[int, float]:
    """The mask rate each training record of a run under a mask rate schedule logged, by step (every session's)."""
    return {
        r["step"]: r["mlm_probability"]
        for r in records(output / "logs" / "train.jsonl")
        if r.get("event") == "train" and "loss" in r
    }


def last_rate(run: dict) -> float:
    """The learning rate a budgeted run's last step trains at, as its plan has it: the 1-sqrt decay's last before
    zero, from the peak over the decay ratio's share of the planned steps, or from the rate a late re-plan found
    over its own decay steps (a slow evaluation left no time for another step: train/run/budget.py late_decay)."""
    budget, config = run["time_budget"], run["config"]
    last = budget["plans"][-1]
    decay = last.get("decay_steps") or math.ceil(config["decay_ratio"] * budget["planned_steps"])
    return last.get("decay_from_lr", config["learning_rate"]) * (1 - math.sqrt((decay - 1) / decay))


def continues(resumed: dict[int, float], uninterrupted: dict[int, float], steps: list[int]) -> None:
    """A run resumed on another number of ranks logged ``steps``, each loss within 2 % of the uninterrupted run's."""
    assert sorted(resumed) == steps, resumed
    for step, loss in resumed.items():
        assert loss == pytest.approx(uninterrupted[step], rel=0.02), (step, resumed, uninterrupted)


# --- the processes of a run ----------------------------------------------------------------------------------------


def rank_pids(launcher_pid: int) -> list[int]:
    """The train.run.job processes below the launcher (torchrun's workers)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        is_rank = b"train.run.job" in cmdline and not any(b"torchrun" in part for part in cmdline[:2])
        if is_rank and is_descendant(int(proc.name), launcher_pid):
            found.append(int(proc.name))
    return found


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed rank whose parent died waits for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def is_descendant(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


# --- environments shared by several modules ------------------------------------------------------------------------


def node_env(tmp_path: Path, rank: int, port: int, cache: str = "node") -> dict[str, str]:
    """Node ``rank`` of two on this machine, given what a PyTorchJob gives its master and worker pods; its own HF
    cache (``cache="node"``) or one shared by both."""
    env = tiny_env(tmp_path / f"node{rank}" / "output", log_format="text")
    env.update(
        # What a PyTorchJob (training-operator >= 1.7) sets on the master (0) and worker (1) pods.
        PET_NNODES="2",
        PET_NODE_RANK=str(rank),
        PET_NPROC_PER_NODE="1",
        PET_MASTER_ADDR="127.0.0.1",
        PET_MASTER_PORT=str(port),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE="2",
        RANK=str(rank),
        HF_HOME=str(tmp_path / (f"node{rank}" if cache == "node" else "shared") / "hf"),
        # entrypoint.sh runs python3: this environment's.
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


HUB_TOKEN = "hf_canary_push_e2e_4242"  # the one token the loopback hub (the `hub` fixture) accepts
REPO_ID = f"{USER}/mlm-e2e"  # MLM_HUB_MODEL_ID=mlm-e2e: the hub puts it in the token's namespace


def push_env(output: Path, hub: HubServer, token: str = HUB_TOKEN, **options: str) -> dict[str, str]:
    """A tiny run that pushes to the loopback hub, its token in a file (HF_TOKEN_FILE, read by entrypoint.sh)."""
    env = tiny_env(output, push_to_hub="true", hub_model_id="mlm-e2e", hub_private_repo="true", **options)
    env.pop("HF_HUB_OFFLINE", None)  # a push needs the hub; the data and the model are local anyway
    env.pop("HF_TOKEN", None)
    token_file = output.parent / f"token-{output.name}"
    token_file.write_text(token + "\n")
    env.update(HF_ENDPOINT=hub.url, HF_TOKEN_FILE=str(token_file))
    return env


# The model matrix's tiny configurations (tests/e2e/test_model_matrix.py; test_packing_runs.py too).
SMALL = "num_hidden_layers=2,hidden_size=64,intermediate_size=128,num_attention_heads=2"
# Each type's tiny config as a user would write it: SMALL plus what the type needs to be that small.
OVERRIDES = {
    "distilbert": "n_layers=2,n_heads=2,dim=64,hidden_dim=128",
    "electra": SMALL + ",embedding_size=32",
    "albert": SMALL + ",embedding_size=32",
    "modernbert": SMALL + ",local_attention=16",
    "eurobert": SMALL + ",num_key_value_heads=2",
}
STOP_AT = 2  # the step job_in_process(env, stop_at=STOP_AT) sends its SIGTERM at
STEPS = 4
