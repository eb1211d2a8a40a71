"""What both series of ``make bench`` share: the environment of a run, one measured run in a fresh ``torchrun``
process, our job's tokenization cache filled before the timed runs, the machine's description, and the result
files (``<stem>.json`` with everything, ``<stem>.md`` with the report, and the report again as the latest).

The series themselves are bench/demo_series.py and bench/real_series.py; this module knows no recipe.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.stats import run_metrics
from train.config import load_config
from train.outputs.runfiles import RunFiles

ROOT = Path(__file__).resolve().parent.parent


class RunFailed(RuntimeError):
    """A run, or a measurement around the runs, ended without its figures; the message carries its log's tail."""


def hf_home(workdir: Path) -> Path:
    """The Hugging Face cache of the timed runs and of the preparation that fills it for them."""
    return workdir / "hf"


def use_local_hf(workdir: Path) -> None:
    """Point this process at the runs' cache, offline; before datasets/transformers are imported, as they read
    HF_HOME once. Everything is built locally, so nothing may wait on a network."""
    os.environ["HF_HOME"] = str(hf_home(workdir))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def child_env(workdir: Path, threads: int | None = None, **extra: str) -> dict[str, str]:
    """The environment of every run: the caller's minus its MLM_* options (they would change the recipes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLM_")}
    env.update(HF_HOME=str(hf_home(workdir)), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    else:
        cores = len(os.sched_getaffinity(0))
        env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS") or str(cores)  # as the launcher sets it for 1 rank
    env.update(extra)
    return env


def run_entrypoint(workdir: Path, **options: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """One whole job through ./entrypoint.sh, launcher to exit, with ``options`` as MLM_* variables (by option
    name) on :func:`child_env`: its captured output and wall seconds; RunFailed with its stderr's tail otherwise."""
    env = child_env(workdir, **{f"MLM_{name.upper()}": value for name, value in options.items()})
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    started = time.perf_counter()
    done = subprocess.run([str(ROOT / "entrypoint.sh")], env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RunFailed(f"the job exited {done.returncode}: {done.stderr[-2000:]}")
    return done, wall


def run_dir(workdir: Path, label: str) -> Path:
    """Where the run called ``label`` keeps its log, its probe record and its job's output_dir."""
    return workdir / "runs" / label


def fresh_run_dir(workdir: Path, label: str) -> Path:
    """run_dir emptied: what an earlier run of the same label left there must not count for this one."""
    path = run_dir(workdir, label)
    shutil.rmtree(path, ignore_errors=True)
    return path


def run_once(
    name: str,
    argv: list[str],
    workdir: Path,
    label: str,
    *,
    device: str,
    threads: int | None,
    module: str = "bench.harness",
) -> dict[str, Any]:
    """One fresh torchrun process of ``module`` (bench.harness: train.run.job plus the probe; bench.run_mlm:
    run_mlm.py's recipe plus the same probe); its figures."""
    directory = fresh_run_dir(workdir, label)
    directory.mkdir(parents=True)
    probe_file = directory / "probe.json"
    output = RunFiles(directory / "output")
    backend = "nccl" if device == "cuda" else "gloo"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
        "-m", module, *argv, "--output_dir", str(output.root), "--ddp_backend", backend,
    ]  # fmt: skip
    load_before = os.getloadavg()[0]
    with open(directory / "log.txt", "w", encoding="utf-8") as log:
        started = time.time()
        code = subprocess.call(
            command,
            cwd=ROOT,
            env=child_env(workdir, threads, BENCH_PROBE_FILE=str(probe_file)),
            stdout=log,
            stderr=log,
        )
        ended = time.time()
    if code != 0 or not probe_file.exists():
        tail = (directory / "log.txt").read_text(encoding="utf-8", errors="replace")[-3000:]
        raise RunFailed(f"{label}: exit {code}; log {directory / 'log.txt'}:\n{tail}")
    probe = json.loads(probe_file.read_text(encoding="utf-8"))
    # eval_loss: the job's final evaluation, where a recipe evaluates (the real series' recipes do not).
    job_results = json.loads(output.all_results.read_text(encoding="utf-8")) if output.all_results.exists() else {}
    return {
        "recipe": name,
        "label": label,
        **run_metrics(probe, started, ended),
        "eval_loss": job_results.get("eval_loss"),
        "losses": probe["losses"],
        "load_avg_1m": [load_before, os.getloadavg()[0]],
        "probe": {k: v for k, v in probe.items() if k not in ("step_ends", "losses")},
    }


def warm_cache(argv: list[str]) -> None:
    """Tokenize the data of our job's run ``argv`` into the cache (HF_HOME), as the run itself would, so that no
    timed run pays for tokenizing."""
    # Not at the top: these import datasets, which reads HF_HOME at import; the series' use_local_hf sets it first.
    from train.data import load_raw, tokenize
    from train.model.load import load_tokenizer, scratch_config

    config = load_config(argv, environ={})
    raw = load_raw(config.data, config.training)
    tokenize(config.data, raw, load_tokenizer(config.model, config.data, raw, scratch_config(config.model)))


def environment() -> dict[str, Any]:
    """The machine and the versions the figures were measured with."""
    import torch
    import transformers

    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_count": os.cpu_count(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def result_header(settings: dict[str, Any]) -> dict[str, Any]:
    """The first keys of a series' result: when, on what machine, with what settings."""
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "environment": environment(),
        "settings": settings,
    }


def write_results(directory: Path, stem: str, result: dict[str, Any], markdown: str, latest: str | None) -> None:
    """<stem>.json (everything) and <stem>.md (the report) and, unless ``latest`` is None, the report again as
    ``latest``: the newest run with the default settings (a tagged run passes None)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    (directory / f"{stem}.md").write_text(markdown, encoding="utf-8")
    if latest is not None:
        (directory / latest).write_text(markdown, encoding="utf-8")
