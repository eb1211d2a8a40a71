"""The report page: ``output_dir/report.html``, one self-contained page (inline SVG charts, no script, no
external resource), and ``output_dir/loss.png`` beside it.

The page shows what the logs hold and nothing they do not. The loss is on a log scale, with a linear view one click
away (radio buttons and CSS: the page runs no script). The learning-rate schedule, warmup included, is drawn only
when train/report/schedule.py confirms it against the log; otherwise the chart says why it is missing.
"""

from __future__ import annotations

import html
import io
import json
import math
import os
from pathlib import Path
from typing import Any

from train.common.console import now
from train.common.rollbacks import rollback_words, rollbacks_of
from train.common.stragglers import RANK_STEP, straggler_words
from train.outputs.runfiles import RunFiles
from train.report.plots import (
    downstream_figure,
    gpu_figure,
    line_figure,
    loss_figure,
    lr_figure,
    quality_figure,
    saves_figure,
    series_figure,
    step_shares_figure,
    svg,
    throughput_figure,
)
from train.report.runlog import RunLog, load_run, number, status_of
from train.report.schedule import lr_schedule

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
    """A value as escaped HTML text: floats to 6 significant digits, dicts and lists as sorted JSON."""
    if isinstance(value, float):
        return html.escape(f"{value:.6g}")
    if isinstance(value, (dict, list)):
        return html.escape(json.dumps(value, sort_keys=True))
    return html.escape("" if value is None else str(value))


def _table(rows: list[tuple[str, Any]], mono: bool = False) -> str:
    """Rows of (name, value) as a two-column table; ``mono`` for values that are code (options)."""
    cls = ' class="mono"' if mono else ""
    body = "".join(f"<tr><th>{_e(k)}</th><td{cls}>{_e(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _summary_rows(log: RunLog) -> list[tuple[str, Any]]:
    """How the run went: status, progress, last losses, speed, and the shape of the job (its latest start's)."""
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
    """What would reproduce the run: seed, data fingerprint, command, versions, hardware, model and data."""
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
    for key, words in (("rollbacks", rollback_words), ("stragglers", straggler_words)):
        said = words(run.get(key))
        if said is not None:
            rows.append((key, said))
    if log.banners:
        banner = log.banners[-1]
        for key in ("gpus", "nodes", "train_samples", "eval_samples", "train_real_tokens", "model", "dataset"):
            if banner.get(key) not in (None, []):
                rows.append((key, banner[key]))
    return rows


def mark_rollbacks(figure: Any, log: RunLog) -> Any:
    """The loss chart with each rollback of run.json drawn where it was detected (the steps after its checkpoint
    were trained again, their batches skipped)."""
    axis, rollbacks = figure.axes[0], rollbacks_of((log.run or {}).get("rollbacks"))
    for index, rollback in enumerate(rollbacks):
        label = "rollback (where it was detected)" if index == 0 else None
        axis.axvline(rollback.detected_at_step, color="tab:red", linestyle="--", linewidth=1, label=label)
    if rollbacks:
        axis.legend(fontsize=8)  # again, with the rollbacks' line
    return figure


def rank_times_figure(log: RunLog) -> Any | None:
    """Each rank's own time per step (train/run/stragglers.py), a line per rank; None for a run of one rank."""
    keys = sorted({key for record in log.train for key in record if key.startswith(RANK_STEP)},
                  key=lambda key: int(key[len(RANK_STEP):]))  # fmt: skip
    series = tuple((key, f"rank {key[len(RANK_STEP) :]}", f"C{index % 10}") for index, key in enumerate(keys))
    return series_figure(log, log.train, series, ("Each rank's own time per step", "seconds")) if series else None


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
    """Replace ``path`` in one rename: a reader (a browser, the hub push) never sees half a page."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


AGAINST_TIME = ("Held-out loss against time since launch", "minutes since the launch", 60.0)
AGAINST_TOKENS = ("Held-out loss against tokens seen", "millions of tokens", 1e6)
DOWNSTREAM_TIME = ("Downstream score against time since launch", "minutes since the launch", 60.0)
DOWNSTREAM_TOKENS = ("Downstream score against tokens seen", "millions of tokens", 1e6)
DOWNSTREAM_NOTE = (
    "Each checkpoint fine-tuned on the task of finetune_results.json (./entrypoint.sh finetune "
    "--task_all_checkpoints true): the mean over its seeds, their standard deviation as bars; the held-out loss "
    "dashed, on the right axis."
)
DRIFT = ("How far the encoder moved", "mean cosine to the starting model", "tab:green")
DRIFT_NOTE = (
    "The adapted encoder's mean-pooled held-out embeddings against the model handed over's (1: unchanged); below "
    "0.8 the run warns: docs/models.md, adapting an encoder without breaking it."
)
STEP_SHARES_NOTE = (
    "MFU: the model's FLOPs of real tokens over the device's peak (docs/monitoring.md); a data wait that stays "
    "high means the device waits for its batches: more loader workers, prepare, or streaming."
)
RANK_TIMES_NOTE = (
    "Each rank's own work per step: fetching its batches and its forward passes, where under DDP no rank waits for "
    "another. A rank far above the others is a straggler every step waits for (run facts: stragglers)."
)
SAVES_NOTE = (
    "Per checkpoint: the seconds the training loop waited for it and the seconds written behind it, in the "
    "background (MLM_ASYNC_SAVE: docs/outputs.md); a synchronous save's are all the loop's."
)
QUALITY_NOTE = (
    "Wall time from the launch: start-up, evaluations and saves included; a resumed run's sessions end to end."
)


def write_report(output_dir: str | Path) -> Path:
    """Write report.html and loss.png into output_dir; returns the report's path. ConfigError when there are no
    logs; other failures are the caller's to contain (the job should not fail over its report)."""
    files = RunFiles(output_dir)
    log = load_run(files.root)

    png = io.BytesIO()
    figure = mark_rollbacks(loss_figure(log, log_scale=True), log)
    figure.savefig(png, format="png", dpi=120)
    _write_atomic(files.loss_png, png.getvalue())

    linear = svg(mark_rollbacks(loss_figure(log, log_scale=False), log), "loss-linear")
    charts = [("loss", scale_toggle("loss", svg(figure, "loss-log"), linear))]
    schedule, caption = lr_schedule(log)
    for name, make, note in (
        ("quality-time", lambda: quality_figure(log, "since_launch_s", *AGAINST_TIME), QUALITY_NOTE),
        ("quality-tokens", lambda: quality_figure(log, "tokens_seen", *AGAINST_TOKENS), ""),
        ("downstream-time", lambda: downstream_figure(log, "since_launch_s", *DOWNSTREAM_TIME), DOWNSTREAM_NOTE),
        ("downstream-tokens", lambda: downstream_figure(log, "tokens_seen", *DOWNSTREAM_TOKENS), ""),
        ("learning-rate", lambda: lr_figure(log, schedule), caption),
        ("throughput", lambda: throughput_figure(log), ""),
        ("step-shares", lambda: step_shares_figure(log), STEP_SHARES_NOTE),
        ("rank-times", lambda: rank_times_figure(log), RANK_TIMES_NOTE),
        ("grad-norm", lambda: line_figure(log, "grad_norm", "Gradient norm", "grad norm", "tab:brown"), ""),
        ("gpu-memory", lambda: gpu_figure(log), ""),
        ("saves", lambda: saves_figure(log), SAVES_NOTE),
        ("encoder-drift", lambda: line_figure(log, "eval_encoder_cosine", *DRIFT, True), DRIFT_NOTE),
    ):
        fig = make()
        if fig is not None:
            body = svg(fig, name) + (f'<figcaption class="note">{_e(note)}</figcaption>' if note else "")
            charts.append((name, body))
    _write_atomic(files.report, render_html(log, charts).encode("utf-8"))
    return files.report
