"""The training report: ``output_dir/report.html`` (one self-contained page: inline SVG charts, no external
resources) and ``output_dir/loss.png``.

    python -m train.report OUTPUT_DIR        (entrypoint.sh report OUTPUT_DIR)

Works for any run, finished or not: it reads ``logs/train.jsonl`` (falling back to the newest checkpoint's
``trainer_state.json`` for runs without one) and ``run.json`` when present. Exit 2 when OUTPUT_DIR holds no logs.

The page shows what the logs hold and nothing they do not. The loss is on a log scale, with a linear view one click
away (radio buttons and CSS: the page runs no script). The learning-rate schedule, warmup included, is drawn only
when ``run.json`` names it and transformers' own scheduler, built from those options, agrees with every logged
learning rate; otherwise the chart says why it is missing.
"""

from __future__ import annotations

import argparse
import html
import io
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train.console import now, say
from train.errors import ConfigError, exit_process, run_main
from train.plots import gpu_figure, line_figure, loss_figure, lr_figure, number, svg, throughput_figure

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
    banners: list[dict[str, Any]] = field(default_factory=list)  # the starts of this run (since its step 0)
    resumed_at: list[int] = field(default_factory=list)  # the steps it resumed from, one per resume
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
            start = record.get("start_step")
            if isinstance(start, int) and not isinstance(start, bool):
                # A start from step `start` (a checkpoint's): what an earlier attempt logged after it is gone
                # from the model, and a start from 0 is a new run (started over, or before any checkpoint).
                for kept in (by_step, evals):
                    for later in [s for s in kept if s > start]:
                        del kept[later]
                if start == 0:
                    log.banners, log.resumed_at = [], []
                else:
                    log.resumed_at = [s for s in log.resumed_at if s < start] + [start]
            log.summary = {}  # an earlier attempt's end is not this run's
            log.banners.append(record)
        elif event == "train_end":
            log.summary = record
    log.train = [by_step[s] for s in sorted(by_step)]
    log.evals = [evals[s] for s in sorted(evals)]
    log.run = _read_json(output_dir / "run.json")
    log.results = _read_json(output_dir / "all_results.json")
    return log


@dataclass
class Schedule:
    """The learning rate of each optimizer step, as transformers' scheduler computes it from run.json's options."""

    kind: str
    warmup_steps: int
    max_steps: int
    steps: list[int]
    rates: list[float]


def _warmup_steps(config: dict[str, Any], max_steps: int) -> int:
    """TrainingArguments.get_warmup_steps: warmup_steps >= 1 is a count, below 1 a fraction of the steps; run.json
    from transformers 4 may carry warmup_ratio instead."""
    steps = number(config.get("warmup_steps")) or 0.0
    if steps >= 1:
        return int(steps)
    if steps > 0:
        return math.ceil(max_steps * steps)
    ratio = number(config.get("warmup_ratio")) or 0.0
    return math.ceil(max_steps * ratio) if ratio > 0 else 0


def _schedule_factor(kind: str, warmup: int, max_steps: int, kwargs: dict[str, Any]) -> Callable[[int], float]:
    """transformers' own multiplier of the learning rate at each scheduler step (the Trainer builds it the same way,
    with get_scheduler). Raises when it cannot be built here (an unknown type, a schedule that is not a function of
    the step such as reduce_lr_on_plateau, no torch)."""
    import torch
    from transformers.optimization import get_scheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = get_scheduler(
        kind,
        optimizer=optimizer,
        num_warmup_steps=warmup,
        num_training_steps=max_steps,
        scheduler_specific_kwargs=dict(kwargs),
    )
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if not lambdas:
        raise TypeError(f"{type(scheduler).__name__} is not a function of the step")
    return lambdas[0]


def lr_schedule(log: RunLog) -> tuple[Schedule | None, str]:
    """The schedule the logged learning rates follow, with the warmup the logs may not show (the first log is at
    step ``logging_steps``), or None and why it is not drawn. It is computed from run.json's options and kept only
    when it agrees with every logged learning rate: transformers 5 logs at step s the rate step s ran with (the
    scheduler's value after s - 1 steps), transformers 4 the one after s steps, and either is accepted."""
    config = (log.run or {}).get("config") or {}
    if not config:
        return None, "Schedule and warmup not drawn: no run.json (the run was interrupted or is still running)."
    base = number(config.get("learning_rate"))
    kind = config.get("lr_scheduler_type")
    max_steps = next(
        (r["max_steps"] for r in reversed(log.banners + log.train) if isinstance(r.get("max_steps"), int)), None
    )
    if base is None or not isinstance(kind, str) or not max_steps or max_steps < 1:
        return None, "Schedule not drawn: run.json or the logs lack learning_rate, lr_scheduler_type or max_steps."
    kwargs = config.get("lr_scheduler_kwargs") or {}
    if isinstance(kwargs, str):
        try:
            kwargs = json.loads(kwargs)
        except json.JSONDecodeError:
            kwargs = None
    if not isinstance(kwargs, dict):
        return None, "Schedule not drawn: run.json's lr_scheduler_kwargs is not a dictionary."
    warmup = _warmup_steps(config, max_steps)
    try:
        factor = _schedule_factor(kind, warmup, max_steps, kwargs)
    except Exception as exc:  # any failure only means the chart shows the logged rates alone
        return None, f"Schedule not drawn: transformers cannot compute {kind!r} here ({type(exc).__name__}: {exc})."
    logged = [
        (int(r["step"]), rate)
        for r in log.train
        if (rate := number(r.get("learning_rate"))) is not None and math.isfinite(rate) and 1 <= r["step"] <= max_steps
    ]
    if not logged:
        return None, "Schedule not drawn: no logged learning rate to check it against."

    def disagreement(offset: int) -> tuple[int, float, float] | None:
        for step, rate in logged:
            expected = base * factor(step - offset)
            if not math.isclose(expected, rate, rel_tol=1e-4, abs_tol=base * 1e-7):
                return step, expected, rate
        return None

    try:
        wrong = disagreement(1)  # transformers 5: step s is logged with the rate it ran with
        offset = 1 if wrong is None or disagreement(0) is not None else 0  # transformers 4: the next step's
    except Exception as exc:  # the function may fail on a step: the chart then shows the logged rates alone
        return None, f"Schedule not drawn: transformers' {kind!r} failed here ({type(exc).__name__}: {exc})."
    if offset == 1 and wrong is not None:
        step, expected, rate = wrong
        return None, (
            f"Schedule not drawn: run.json's {kind} schedule (learning rate {base:g}, warmup {warmup} steps) gives "
            f"{expected:.6g} at step {step}, the log {rate:.6g}."
        )
    shown = {1, max_steps, *range(1, min(max_steps, 200) + 1), warmup, warmup + 1, warmup + 2}
    shown |= {1 + round(i * (max_steps - 1) / 1000) for i in range(1001)}
    steps = sorted(s for s in shown if 1 <= s <= max_steps)
    rates = [base * factor(s - offset) for s in steps]
    return Schedule(kind, warmup, max_steps, steps, rates), (
        f"Dashed: the {kind} schedule from run.json (learning rate {base:g}, warmup {warmup} steps, {max_steps} "
        f"steps in all), computed by transformers; it agrees with all {len(logged)} logged learning rates."
    )


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
.chart figcaption { margin: .2rem .4rem; }
.toggle { font-size: .85rem; margin: .2rem .4rem 0; }
/* A chart drawn twice (log and linear y axis): the checked radio button shows one. */
input.show-log:checked ~ .scale-linear, input.show-linear:checked ~ .scale-log { display: none; }
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
    if log.resumed_at:
        rows.append(("resumed at step", ", ".join(str(s) for s in log.resumed_at)))
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


def scale_toggle(name: str, log_svg: str, linear_svg: str) -> str:
    """Both drawings of a chart and two radio buttons (log checked) that show one of them: CSS only, no script."""
    inputs = "".join(
        f'<input type="radio" class="show-{scale}" name="{name}-scale" id="{name}-scale-{scale}"'
        f'{" checked" if scale == "log" else ""}><label for="{name}-scale-{scale}">{label}</label> '
        for scale, label in (("log", "log scale"), ("linear", "linear"))
    )
    return (
        f'<span class="toggle">y axis:</span> {inputs}'
        f'<div class="scale-log">{log_svg}</div><div class="scale-linear">{linear_svg}</div>'
    )


def render_html(log: RunLog, charts: list[tuple[str, str]]) -> str:
    """The page; ``charts`` are (name, inner HTML of its figure)."""
    status = status_of(log)
    cls = status if status in ("finished", "preempted") else "other"
    config = (log.run or {}).get("config") or {}
    chart_html = "".join(f'<figure class="chart" id="chart-{_e(name)}">{body}</figure>' for name, body in charts)
    resumes = (
        '<p class="note">Dotted vertical lines: the steps a resumed run started again from (its checkpoint\'s). '
        "What an earlier attempt logged after that step is left out.</p>"
        if log.resumed_at
        else ""
    )
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
{resumes}
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
    figure = loss_figure(log, log_scale=True)
    figure.savefig(png, format="png", dpi=120)
    _write_atomic(output_dir / LOSS_PNG, png.getvalue())

    linear = svg(loss_figure(log, log_scale=False), "loss-linear")
    charts = [("loss", scale_toggle("loss", svg(figure, "loss-log"), linear))]
    schedule, caption = lr_schedule(log)
    for name, make, note in (
        ("learning-rate", lambda: lr_figure(log, schedule), caption),
        ("throughput", lambda: throughput_figure(log), ""),
        ("grad-norm", lambda: line_figure(log, "grad_norm", "Gradient norm", "grad norm", "tab:brown"), ""),
        ("gpu-memory", lambda: gpu_figure(log), ""),
    ):
        fig = make()
        if fig is not None:
            body = svg(fig, name) + (f'<figcaption class="note">{_e(note)}</figcaption>' if note else "")
            charts.append((name, body))
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
    exit_process(run_main(main))
