"""What a run left behind, read back as series ready to plot: :class:`RunLog` and :func:`load_run`.

The charts (train/report/plots.py) and the schedule (train/report/schedule.py) take their types from here, so the
report's modules import in one direction only. Every file name is train/outputs/runfiles.py's.

The source is ``logs/train.jsonl``; a run without one (an older image, a crash before the first log step) falls back
to the Trainer's own log history in ``trainer_state.json`` (output_dir's, else the newest checkpoint's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train.common.errors import ConfigError
from train.outputs.runfiles import TRAINER_STATE, RunFiles

Record = dict[str, Any]


@dataclass
class RunLog:
    """What a run left behind, as series ready to plot."""

    output_dir: Path
    source: str  # the file the records came from, named on the page
    train: list[Record] = field(default_factory=list)  # one record per step, the latest line winning
    evals: list[Record] = field(default_factory=list)
    saves: list[Record] = field(default_factory=list)  # the checkpoint records, one per save (its step's latest)
    banners: list[Record] = field(default_factory=list)  # the starts of this run (since its step 0)
    resumed_at: list[int] = field(default_factory=list)  # the steps it resumed from, one per resume
    phase_starts: list[tuple[int, str]] = field(default_factory=list)  # a phased run's: the step, the phase's name
    summary: Record = field(default_factory=dict)  # the Trainer's train_end record
    run: Record | None = None  # run.json
    results: Record | None = None  # all_results.json
    downstream: Record | None = None  # finetune_results.json, when finetune wrote it here (a run's series or a score)


def number(value: Any) -> float | None:
    """A plottable float: JSON numbers, and 'nan'/'inf' strings the log writes for non-finite values."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def status_of(log: RunLog) -> str:
    """run.json's status; a run without run.json never reached its end (or has not yet)."""
    if log.run and log.run.get("status"):
        return str(log.run["status"])
    return "interrupted or still running (no run.json)"


def _read_jsonl(path: Path) -> list[Record]:
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the last line of a killed run may be cut off
        if isinstance(record, dict):
            records.append(record)
    return records


def read_record(path: Path) -> Record | None:
    """A JSON object from ``path``; None when it is missing, unreadable or no object (nothing recorded)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # ValueError: not JSON, or not UTF-8 either
        return None
    return data if isinstance(data, dict) else None


def _history_records(history: Any) -> list[Record]:
    """The Trainer's log_history entries as the events train.jsonl would have written for them."""
    records = []
    for entry in history if isinstance(history, list) else []:
        if not isinstance(entry, dict):
            continue
        if any(k.startswith("eval_") for k in entry):
            records.append({"event": "eval", **entry})
        elif "train_runtime" in entry:
            records.append({"event": "train_end", **entry})
        elif "loss" in entry:
            records.append({"event": "train", **entry})
    return records


def _from_trainer_state(files: RunFiles) -> tuple[list[Record], Path | None]:
    """Records from the Trainer's own log history, for runs without train.jsonl, and the file they came from:
    output_dir's trainer_state.json, else the newest checkpoint's that holds any."""
    candidates = [files.root / TRAINER_STATE] + [c / TRAINER_STATE for c in reversed(files.checkpoints())]
    for path in candidates:
        state = read_record(path)
        records = _history_records(state.get("log_history")) if state else []
        if records:
            return records, path
    return [], None


def _has_steps(records: list[Record]) -> bool:
    return any(r.get("event") in ("train", "eval") for r in records)


def load_run(output_dir: str | Path) -> RunLog:
    """Read a run's logs; ConfigError when there are none."""
    files = RunFiles(output_dir)
    if not files.root.is_dir():
        raise ConfigError(f"{files.root}: no such directory; expected the output_dir of a training run")
    source: Path | None = files.train_jsonl
    records = _read_jsonl(files.train_jsonl) if files.train_jsonl.is_file() else []
    if not _has_steps(records):
        fallback, source = _from_trainer_state(files)
        records += fallback
    if not _has_steps(records) or source is None:
        jsonl = files.train_jsonl.relative_to(files.root)
        raise ConfigError(
            f"{files.root}: no training logs ({jsonl} or a checkpoint's {TRAINER_STATE}); "
            "expected the output_dir of a run that reached its first log step"
        )
    log = RunLog(output_dir=files.root, source=str(source))
    _replay(log, records)
    log.run = read_record(files.run_json)
    log.results = read_record(files.all_results)
    log.downstream = read_record(files.finetune_results)
    return log


def _replay(log: RunLog, records: list[Record]) -> None:
    """Fill ``log`` from the records in the order they were written, keeping only this run's past: a resume from a
    checkpoint drops what an earlier attempt logged after it, and a start from step 0 begins a new run."""
    by_step: dict[int, Record] = {}
    evals: dict[int, Record] = {}
    saves: dict[int, Record] = {}
    for record in records:
        event, step = record.get("event"), record.get("step")
        if event == "train" and isinstance(step, int):
            by_step[step] = record  # after a resume, the replayed steps' newer lines win
        elif event == "eval" and isinstance(step, int):
            evals[step] = record
        elif event == "checkpoint" and isinstance(step, int):
            saves[step] = record
        elif event == "banner":
            start = record.get("start_step")
            if isinstance(start, int) and not isinstance(start, bool):
                # A start from step `start` (a checkpoint's): what an earlier attempt logged after it is gone
                # from the model, and a start from 0 is a new run (started over, or before any checkpoint).
                for kept in (by_step, evals, saves):
                    for later in [s for s in kept if s > start]:
                        del kept[later]
                phase = record["phase"] if isinstance(record.get("phase"), dict) else {}
                if start == 0:
                    log.banners, log.resumed_at, log.phase_starts = [], [], []
                elif phase.get("start") == start:  # a phase's first start (train/launch/phases.py), no resume
                    log.phase_starts = [p for p in log.phase_starts if p[0] < start] + [(start, str(phase.get("name")))]
                else:
                    log.resumed_at = [s for s in log.resumed_at if s < start] + [start]
            log.summary = {}  # an earlier attempt's end is not this run's
            log.banners.append(record)
        elif event == "train_end":
            log.summary = record
    log.train = [by_step[s] for s in sorted(by_step)]
    log.evals = [evals[s] for s in sorted(evals)]
    log.saves = [saves[s] for s in sorted(saves)]
