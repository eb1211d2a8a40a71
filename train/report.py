"""The training report: ``output_dir/report.html`` (one self-contained page: inline SVG charts, no external
resources) and ``output_dir/loss.png``.

    python -m train.report OUTPUT_DIR        (entrypoint.sh report OUTPUT_DIR)

Works for any run, finished or not: it reads ``logs/train.jsonl`` (falling back to the newest checkpoint's
``trainer_state.json`` for runs without one) and ``run.json`` when present. Exit 2 when OUTPUT_DIR holds no logs.
"""

from __future__ import annotations

import argparse
import html
import io
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train.console import now, say
from train.errors import ConfigError, run_main
from train.plots import gpu_figure, line_figure, loss_figure, number, svg, throughput_figure

REPORT_NAME = "report.html"
LOSS_PNG = "loss.png"
JSONL = Path("logs") / "train.jsonl"


# ---- reading ---------------------------------------------------------------------------------------------------------


@dataclass
class RunLog:
    """What a run left behind, as series ready to plot."""

    output_dir: Path
    source: str
    train: list[dict[str, Any]] = field(default_factory=list)  # one record per step, the latest line winning
    evals: list[dict[str, Any]] = field(default_factory=list)
    banners: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)  # the Trainer's train_end record
    run: dict[str, Any] | None = None  # run.json
    results: dict[str, Any] | None = None  # all_results.json


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the last line of a killed run may be cut off
        if isinstance(record, dict):
            records.append(record)
    return records


def _from_trainer_state(output_dir: Path) -> list[dict[str, Any]]:
    """Records from the Trainer's own log history (the newest checkpoint's), for runs without train.jsonl."""
    candidates = [output_dir / "trainer_state.json"]
    checkpoints = sorted(
        (p for p in output_dir.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()),
        key=lambda p: int(p.name.split("-")[-1]),
        reverse=True,
    )
    candidates += [p / "trainer_state.json" for p in checkpoints]
    for path in candidates:
        try:
            history = json.loads(path.read_text(encoding="utf-8")).get("log_history", [])
        except (OSError, json.JSONDecodeError, AttributeError):
            continue
        records = []
        for entry in history:
            if not isinstance(entry, dict):
                continue
            if any(k.startswith("eval_") for k in entry):
                records.append({"event": "eval", **entry})
            elif "train_runtime" in entry:
                records.append({"event": "train_end", **entry})
            elif "loss" in entry:
                records.append({"event": "train", **entry})
        if records:
            return records
    return []


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def load_run(output_dir: Path) -> RunLog:
    """Read a run's logs; ConfigError when there are none."""
    if not output_dir.is_dir():
        raise ConfigError(f"{output_dir}: no such directory; expected the output_dir of a training run")
    source = output_dir / JSONL
    records = _read_jsonl(source) if source.is_file() else []
    if not any(r.get("event") in ("train", "eval") for r in records):
        fallback = _from_trainer_state(output_dir)
        if fallback:
            records, source = records + fallback, output_dir / "checkpoint-*/trainer_state.json"
    if not any(r.get("event") in ("train", "eval") for r in records):
        raise ConfigError(
            f"{output_dir}: no training logs ({JSONL} or a checkpoint's trainer_state.json); "
            "expected the output_dir of a run that reached its first log step"
        )
    log = RunLog(output_dir=output_dir, source=str(source))
    by_step: dict[int, dict[str, Any]] = {}
    evals: dict[int, dict[str, Any]] = {}
    for record in records:
        event, step = record.get("event"), record.get("step")
        if event == "train" and isinstance(step, int):
            by_step[step] = record  # after a resume, the replayed steps' newer lines win
        elif event == "eval" and isinstance(step, int):
            evals[step] = record
        elif event == "banner":
            log.banners.append(record)
        elif event == "train_end":
            log.summary = record
    log.train = [by_step[s] for s in sorted(by_step)]
    log.evals = [evals[s] for s in sorted(evals)]
    log.run = _read_json(output_dir / "run.json")
    log.results = _read_json(output_dir / "all_results.json")
    return log


def status_of(log: RunLog) -> str:
    if log.run and log.run.get("status"):
        return str(log.run["status"])
    return "interrupted or still running (no run.json)"


# ---- page ------------------------------------------------------------------------------------------------------------

STYLE = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2rem auto; max-width: 1400px;
       padding: 0 1rem; color: #222; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
.status { display: inline-block; padding: .1rem .6rem; border-radius: .8rem; font-weight: 600; }
.finished { background: #d9f2dd; } .preempted { background: #fff2c6; } .other { background: #f9d6d5; }
table { border-collapse: collapse; font-size: .9rem; } td, th { border-bottom: 1px solid #ddd; padding: .25rem .7rem;
       text-align: left; vertical-align: top; } th { background: #f5f5f5; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 1rem; }
.chart { border: 1px solid #e3e3e3; border-radius: .4rem; padding: .3rem; }
.chart svg { width: 100%; height: auto; }
code, .mono { font-family: ui-monospace, monospace; font-size: .85rem; }
.note { color: #666; font-size: .85rem; }
"""


def _e(value: Any) -> str:
    if isinstance(value, float):
        return html.escape(f"{value:.6g}")
    if isinstance(value, (dict, list)):
        return html.escape(json.dumps(value, sort_keys=True))
    return html.escape("" if value is None else str(value))


def _table(rows: list[tuple[str, Any]], mono: bool = False) -> str:
    cls = ' class="mono"' if mono else ""
    body = "".join(f"<tr><th>{_e(k)}</th><td{cls}>{_e(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _summary_rows(log: RunLog) -> list[tuple[str, Any]]:
    banner = log.banners[-1] if log.banners else {}
    run = log.run or {}
    results = log.results or {}
    last = log.train[-1] if log.train else {}
    last_eval = log.evals[-1] if log.evals else {}
    rows: list[tuple[str, Any]] = [("status", status_of(log))]
    for key in ("started", "ended"):
        if run.get(key):
            rows.append((key, run[key]))
    max_steps = last.get("max_steps") or banner.get("max_steps")
    step = max([r["step"] for r in log.train + log.evals], default=0)
    rows.append(("steps", f"{step} of {max_steps}" if max_steps else step))
    if "epoch" in last or "epoch" in last_eval:
        rows.append(("epoch", max(number(last.get("epoch")) or 0, number(last_eval.get("epoch")) or 0)))
    if "loss" in last:
        rows.append(("last train loss", number(last["loss"])))
    eval_loss = number(last_eval.get("eval_loss"))
    if eval_loss is not None:
        rows.append(("last eval loss", eval_loss))
        rows.append(("perplexity", math.exp(eval_loss) if eval_loss < 700 else math.inf))
    if "eval_accuracy" in last_eval:
        rows.append(("eval accuracy (masked tokens)", number(last_eval["eval_accuracy"])))
    runtime = number(log.summary.get("train_runtime") or results.get("train_runtime"))
    if runtime is not None:
        rows.append(("train runtime (s)", runtime))
    speeds = [v for v in (number(r.get("tokens_per_second")) for r in log.train) if v is not None]
    if speeds:
        rows.append(("real tokens/s (median of log steps)", sorted(speeds)[len(speeds) // 2]))
    if results.get("train_tokens_per_second"):
        rows.append(("real tokens/s (whole run)", number(results["train_tokens_per_second"])))
    for key, label in (
        ("world_size", "world size"),
        ("precision", "precision"),
        ("global_batch_size", "global batch"),
        ("image_revision", "image revision"),
    ):
        value = banner.get(key, run.get(key))
        if value is not None:
            rows.append((label, value))
    if len(log.banners) > 1:
        rows.append(("starts (resumes)", len(log.banners)))
    return rows


def _facts_rows(log: RunLog) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    run = log.run or {}
    for key in ("seed", "dataset_fingerprint", "world_size", "image_revision"):
        if key in run:
            rows.append((key, run[key]))
    if run.get("command"):
        rows.append(("command", " ".join(run["command"])))
    versions = run.get("versions") or (log.banners[-1].get("versions") if log.banners else None) or {}
    for name, version in versions.items():
        rows.append((f"version: {name}", version))
    for key, value in (run.get("hardware") or {}).items():
        rows.append((f"hardware: {key}", value))
    if log.banners:
        banner = log.banners[-1]
        for key in ("gpus", "nodes", "train_samples", "eval_samples", "train_real_tokens", "model", "dataset"):
            if banner.get(key) not in (None, []):
                rows.append((key, banner[key]))
    return rows


def render_html(log: RunLog, charts: list[tuple[str, str]]) -> str:
    status = status_of(log)
    cls = status if status in ("finished", "preempted") else "other"
    config = (log.run or {}).get("config") or {}
    chart_html = "".join(f'<figure class="chart" id="chart-{_e(name)}">{svg}</figure>' for name, svg in charts)
    config_html = (
        _table(sorted(config.items()), mono=True)
        if config
        else '<p class="note">No run.json yet (the run was interrupted or is still running).</p>'
    )
    generated = now()
    title = f"Training report: {log.output_dir.resolve().name}"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<style>{STYLE}</style>
</head>
<body>
<h1>{_e(title)}</h1>
<p><span class="status {cls}">{_e(status)}</span> <span class="note mono">{_e(log.output_dir.resolve())}</span></p>
<h2>Summary</h2>
{_table(_summary_rows(log))}
<h2>Charts</h2>
<div class="charts">{chart_html}</div>
<p class="note">Dotted vertical lines: where a resumed run started again.</p>
<h2>Run facts</h2>
{_table(_facts_rows(log))}
<h2>Configuration</h2>
<details><summary>{len(config)} resolved options (secrets redacted), from run.json</summary>
{config_html}
</details>
<p class="note">Generated {_e(generated)} by <code>python -m train.report</code> from {_e(log.source)}.</p>
</body>
</html>
"""


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_report(output_dir: Path) -> Path:
    """Write report.html and loss.png into output_dir; returns the report's path. ConfigError when there are no
    logs; other failures are the caller's to contain (the job should not fail over its report)."""
    output_dir = Path(output_dir)
    log = load_run(output_dir)

    png = io.BytesIO()
    figure = loss_figure(log)
    figure.savefig(png, format="png", dpi=120)
    _write_atomic(output_dir / LOSS_PNG, png.getvalue())

    charts = [("loss", svg(figure))]
    for name, make in (
        ("learning-rate", lambda: line_figure(log, "learning_rate", "Learning rate", "learning rate", "tab:red")),
        ("throughput", lambda: throughput_figure(log)),
        ("grad-norm", lambda: line_figure(log, "grad_norm", "Gradient norm", "grad norm", "tab:brown")),
        ("gpu-memory", lambda: gpu_figure(log)),
    ):
        fig = make()
        if fig is not None:
            charts.append((name, svg(fig)))
    report = output_dir / REPORT_NAME
    _write_atomic(report, render_html(log, charts).encode("utf-8"))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="entrypoint.sh report", description="Write OUTPUT_DIR/report.html and OUTPUT_DIR/loss.png."
    )
    parser.add_argument("output_dir", metavar="OUTPUT_DIR", help="the output_dir of a finished or interrupted run")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, message already printed by argparse)
        return int(exc.code or 0)
    report = write_report(Path(args.output_dir))
    say(f"report: {report} (and {report.with_name(LOSS_PNG)})")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
