"""The start-up figures of ``make bench``: what reaching a first optimizer step costs, against bare imports.

The floor of any job on this stack is importing torch, transformers and datasets (``bare``; transformers imports
lazily, so that does not load the Trainer). Against it, in fresh processes alternating ``repeats`` times: what a
training step needs (``trainer``: bare plus ``from transformers import Trainer``), our rank program (``job``:
``import train.run.job``) and our launcher (``launcher``). Each is timed inside its process, around the import
statement only (interpreter start and exit excluded), and as the process's whole wall clock. Then the warm
2-step demo run through ``entrypoint.sh`` to its end (launcher, torchrun, rank, final evaluation on 64 samples,
the model written): its wall, its time to the first step, and the steps' own time (the Trainer's
``train_runtime``: the two steps and their data loader starting).

Targets from the performance issue: importing the job costs at most 1.2x bare; the warm demo run takes at most
2x bare plus the steps. The runners and the summary are here (the summary tested in
tests/bench/test_startup.py); the report's section is bench.report.startup_markdown.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bench.stats import spread

IMPORTS: dict[str, str] = {
    "bare": "import torch, transformers, datasets",
    "trainer": "import torch, transformers, datasets; from transformers import Trainer",
    "job": "import train.run.job",
    "launcher": "import train.launch.__main__",
}
JOB_IMPORT_TARGET = 1.2  # import train.run.job / bare
DEMO_RUN_TARGET = 2.0  # (warm demo wall - its steps) / bare

TIMER = "import time; _t = time.perf_counter(); {statement}; print(time.perf_counter() - _t)"


def time_import(statement: str, env: Mapping[str, str], cwd: Path) -> dict[str, float]:
    """One fresh interpreter importing ``statement``: the import's seconds and the process's wall seconds."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", TIMER.format(statement=statement)], env=dict(env), cwd=cwd, capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{statement!r}: exit {done.returncode}: {done.stderr[-2000:]}")
    return {"import_s": float(done.stdout.strip().splitlines()[-1]), "process_s": wall}


def time_imports(env: Mapping[str, str], cwd: Path, repeats: int) -> dict[str, list[dict[str, float]]]:
    """Every statement of IMPORTS, alternating, ``repeats`` rounds."""
    times: dict[str, list[dict[str, float]]] = {name: [] for name in IMPORTS}
    for _ in range(repeats):
        for name, statement in IMPORTS.items():
            times[name].append(time_import(statement, env, cwd))
    return times


def log_record(line: str) -> dict[str, Any]:
    """A JSON log line's record (MLM_LOG_FORMAT=json), else {}: a training step's has event "train"."""
    try:
        record = json.loads(line) if line.startswith("{") else {}
    except json.JSONDecodeError:
        return {}
    return record if isinstance(record, dict) else {}


def demo_run(command: list[str], env: Mapping[str, str], cwd: Path) -> dict[str, float]:
    """A whole run of the demo through the front door, its JSON records read as they come: wall, first step and
    the Trainer's train_runtime."""
    started = time.perf_counter()
    first_step = None
    runtime = None
    with subprocess.Popen(
        command, env=dict(env), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            record = log_record(line)
            if record.get("event") == "train" and first_step is None:
                first_step = time.perf_counter() - started
            if record.get("event") == "train_end":
                runtime = float(record["train_runtime"])
        code = process.wait()
    wall = time.perf_counter() - started
    if code != 0 or first_step is None or runtime is None:
        raise RuntimeError(f"demo run: exit {code}, first step seen: {first_step is not None}")
    return {"wall_s": wall, "first_step_s": first_step, "steps_s": runtime}


def summarise(imports: dict[str, list[dict[str, float]]], demo: list[dict[str, float]]) -> dict[str, Any]:
    """Medians [min – max] of each import and of the demo runs; the two target ratios per round and their median."""
    bare = [t["import_s"] for t in imports["bare"]]
    summary: dict[str, Any] = {
        "imports": {
            name: {
                "import_s": spread([t["import_s"] for t in runs]),
                "process_s": spread([t["process_s"] for t in runs]),
                "ratio_to_bare": spread([t["import_s"] / b for t, b in zip(runs, bare, strict=True)]),
            }
            for name, runs in imports.items()
        },
    }
    if demo:
        floor = statistics.median(bare)
        summary["demo"] = {key: spread([d[key] for d in demo]) for key in ("wall_s", "first_step_s", "steps_s")}
        summary["demo"]["overhead_to_bare"] = spread([(d["wall_s"] - d["steps_s"]) / floor for d in demo])
    summary["targets"] = targets(summary)
    return summary


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's two start-up targets: the measured median ratio, the target and whether it is met."""
    rows = [
        {
            "what": "import train.run.job / bare import",
            "ratio": summary["imports"]["job"]["ratio_to_bare"]["median"],
            "target": JOB_IMPORT_TARGET,
        }
    ]
    if "demo" in summary:
        rows.append(
            {
                "what": "warm 2-step demo run less its steps / bare import",
                "ratio": summary["demo"]["overhead_to_bare"]["median"],
                "target": DEMO_RUN_TARGET,
            }
        )
    for row in rows:
        row["met"] = row["ratio"] <= row["target"]
    return rows


def measure(
    env: Mapping[str, str],
    cwd: Path,
    demo_env: Callable[[int], Mapping[str, str]],
    repeats: int,
) -> dict[str, Any]:
    """The imports, then ``repeats`` warm demo runs (``demo_env(i)``: the environment of the i-th, its caches
    filled by an earlier run), and their summary."""
    imports = time_imports(env, cwd, repeats)
    demo = [demo_run([str(cwd / "entrypoint.sh")], demo_env(i), cwd) for i in range(repeats)]
    return {"imports": imports, "demo_runs": demo, **summarise(imports, demo)}
