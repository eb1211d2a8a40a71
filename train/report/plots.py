"""The report's charts (matplotlib, drawn off-screen): loss, the held-out loss against time and tokens, the
downstream score of the run's checkpoints beside it (finetune_results.json), learning rate, throughput, gradient
norm, GPU memory, what each checkpoint save cost.
Imported only when a report is written, and matplotlib only inside the functions that draw, so a training step
never pays for it.

A series with fewer than ``MARKERS_BELOW`` points is drawn as points joined by a thin line, so each one is seen (a
single point drawn as a line is invisible); longer series as lines. Where a run resumed, a dotted vertical line
marks the step it started again from, with a legend entry; there is none for a run that never resumed."""

from __future__ import annotations

import io
import math
import re
from typing import Any

from train.report.runlog import Record, RunLog, number
from train.report.schedule import Schedule

MARKERS_BELOW = 20
RESUMED_LABEL = "resumed here"


def _series(records: list[Record], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the records with a finite ``key``: a NaN loss leaves a gap rather than breaking the axis."""
    xs, ys = [], []
    for record in records:
        value = number(record.get(key))
        if value is not None and math.isfinite(value):
            xs.append(float(record["step"]))
            ys.append(value)
    return xs, ys


def _figure(title: str, ylabel: str) -> tuple[Any, Any]:
    """A new figure and its axes, drawn off-screen: a bare Figure renders through the canvas its format needs
    (Agg for PNG, the SVG backend) without pyplot, whose import (its GUI backend machinery: about 0.35 s) and
    global figure registry a report written at a run's end has no use for."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.4), dpi=100)
    ax = fig.subplots()
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _plot(
    ax: Any, xs: list[float], ys: list[float], color: str, label: str | None = None, gid: str | None = None
) -> Any:
    """One series: points joined by a thin line when there are few of them, a line otherwise."""
    few = len(xs) < MARKERS_BELOW
    (line,) = ax.plot(
        xs,
        ys,
        label=label,
        color=color,
        linewidth=1.0 if few else 1.5,
        marker="o" if few else None,
        markersize=4,
    )
    if gid:
        line.set_gid(gid)
    return line


def _mark_resumes(ax: Any, log: RunLog) -> None:
    """A dotted line at each step the run resumed from (one legend entry for all of them), and a dash-dotted one
    where each phase of a phased run began (its name in the legend)."""
    for i, step in enumerate(log.resumed_at):
        line = ax.axvline(step, color="grey", linestyle=":", linewidth=1, label=RESUMED_LABEL if i == 0 else None)
        line.set_gid(f"resumed-{step}")
    for step, name in log.phase_starts:
        line = ax.axvline(step, color="black", linestyle="-.", linewidth=1, label=f"phase {name}")
        line.set_gid(f"phase-{step}")


def _legend(ax: Any, **kwargs: Any) -> None:
    """A legend only when something is labelled (matplotlib warns about an empty one)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, **kwargs)


def _log_scale(ax: Any) -> None:
    """A log y axis labelled with plain numbers (2, 3, 4 rather than 2×10⁰): loss rarely spans a decade."""
    from matplotlib.ticker import LogFormatter

    ax.set_yscale("log", nonpositive="mask")
    ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


SOURCE = re.compile(r"^eval_(?P<source>\w+?)_loss$")  # eval_<source>_loss: a mixture's per source
SOURCE_COLORS = ("tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")


def sources_evaluated(log: RunLog) -> list[str]:
    """The mixture's sources the evaluations give a loss for, in their first record's order."""
    found: dict[str, None] = {}
    for record in log.evals:
        for key in record:
            if match := SOURCE.match(key):
                found.setdefault(match["source"])
    return list(found)


def loss_figure(log: RunLog, log_scale: bool = True) -> Any:
    """Train and eval loss; on a log y axis by default, where a converged tail stays readable (linear when no
    value is positive)."""
    xs, ys = _series(log.train, "loss")
    exs, eys = _series(log.evals, "eval_loss")
    log_scale = log_scale and any(y > 0 for y in ys + eys)
    fig, ax = _figure("Loss (log scale)" if log_scale else "Loss", "loss")
    ax.set_gid("loss-log-scale" if log_scale else "loss-linear-scale")
    if xs:
        _plot(ax, xs, ys, "tab:blue", label="train loss", gid="train-loss")
    if exs:
        _plot(ax, exs, eys, "tab:orange", label="eval loss", gid="eval-loss")
    for index, source in enumerate(sources_evaluated(log)):  # a mixture's loss per source, dashed beside the total
        sxs, sys_ = _series(log.evals, f"eval_{source}_loss")
        color = SOURCE_COLORS[index % len(SOURCE_COLORS)]
        _plot(ax, sxs, sys_, color, label=f"eval loss: {source}", gid=f"eval-loss-{source}").set_linestyle("--")
    if log_scale:
        _log_scale(ax)
    _mark_resumes(ax, log)
    _legend(ax)
    fig.tight_layout()
    return fig


def _end_to_end(log: RunLog, x_key: str) -> dict[int, float]:
    """Each evaluation's step and its ``x_key`` (the wall time since the launch, the tokens seen), the sessions of
    a resumed run laid end to end (each counts from its own launch; the time between them, the run not running,
    left out)."""
    at: dict[int, float] = {}
    offset, previous = 0.0, None
    for record in log.evals:
        x = number(record.get(x_key))
        if x is None:
            continue
        if previous is not None and x < previous:  # a resumed session counts from its own launch: end to end
            offset += previous
        previous = x
        at[record["step"]] = x + offset
    return at


def quality_figure(log: RunLog, x_key: str, title: str, xlabel: str, scale: float = 1.0) -> Any | None:
    """The held-out loss against ``x_key`` of each evaluation (the wall time since the launch, the tokens seen):
    what a run bought for its time; None when no evaluation recorded it (a log from before these were kept). The
    sessions of a resumed run are laid end to end (the time between them, the run not running, left out)."""
    xs, ys = _held_out(log, x_key, scale)
    if not xs:
        return None
    fig, ax = _figure(title, "eval loss")
    ax.set_xlabel(xlabel)
    _plot(ax, xs, ys, "tab:orange", gid=f"quality-{x_key.replace('_', '-')}")
    fig.tight_layout()
    return fig


def _held_out(log: RunLog, x_key: str, scale: float) -> tuple[list[float], list[float]]:
    """(x / scale, held-out loss) of each evaluation that recorded both."""
    at = _end_to_end(log, x_key)
    xs, ys = [], []
    for record in log.evals:
        y = number(record.get("eval_loss"))
        if record["step"] in at and y is not None and math.isfinite(y):
            xs.append(at[record["step"]] / scale)
            ys.append(y)
    return xs, ys


DOWNSTREAM_METRICS = (("accuracy", "accuracy", "tab:green"), ("macro_f1", "macro F1", "tab:purple"))


def _score(point: Any, metric: str) -> tuple[float, float] | None:
    """(mean, spread) of ``metric`` in one model's block of finetune_results.json (spread 0 for one seed)."""
    if not isinstance(point, dict) or not isinstance(point.get("mean"), dict):
        return None
    mean = number(point["mean"].get(metric))
    spread = number(point["std"].get(metric)) if isinstance(point.get("std"), dict) else None
    return None if mean is None else (mean, spread or 0.0)


def downstream_figure(log: RunLog, x_key: str, title: str, xlabel: str, scale: float = 1.0) -> Any | None:
    """The downstream score of each model of the run (finetune_results.json's series: the mean over the seeds,
    their standard deviation as error bars) against ``x_key``, with the held-out loss on a second axis beside it;
    None without a series. A model is placed where the run's evaluation at its step is (so a resumed run's
    sessions lie end to end as in the loss's chart); one without such an evaluation where the series recorded it,
    unless the run resumed (its own clock would be another session's)."""
    series = (log.downstream or {}).get("series")
    if not isinstance(series, list):
        return None
    at = _end_to_end(log, x_key)
    fig, ax = _figure(title, "downstream score")
    ax.set_xlabel(xlabel)
    drawn = False
    for metric, label, color in DOWNSTREAM_METRICS:
        xs, ys, spreads = [], [], []
        for point in series:
            step = point.get("step") if isinstance(point, dict) else None
            x = at.get(step) if isinstance(step, int) else None
            if x is None and not log.resumed_at and isinstance(point, dict):
                x = number(point.get(x_key))
            score = _score(point, metric)
            if x is not None and score is not None:
                xs.append(x / scale)
                ys.append(score[0])
                spreads.append(score[1])
        if xs:
            bars = ax.errorbar(xs, ys, yerr=spreads, color=color, marker="o", markersize=4, capsize=3, label=label)
            bars.lines[0].set_gid(f"downstream-{metric.replace('_', '-')}-{x_key.replace('_', '-')}")
            drawn = True
    if not drawn:
        return None
    lxs, lys = _held_out(log, x_key, scale)
    if lxs:
        twin = ax.twinx()
        twin.set_ylabel("eval loss")
        (line,) = twin.plot(lxs, lys, color="tab:orange", linestyle="--", linewidth=1, label="held-out loss")
        line.set_gid(f"downstream-eval-loss-{x_key.replace('_', '-')}")
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles + [line], labels + ["held-out loss"], fontsize=8)
    else:
        _legend(ax)
    fig.tight_layout()
    return fig


def line_figure(log: RunLog, key: str, title: str, ylabel: str, color: str, evaluated: bool = False) -> Any | None:
    """One logged series over the steps (the gradient norm; ``evaluated``: of the evaluations, an adapted encoder's
    drift); None when the log never holds it."""
    xs, ys = _series(log.evals if evaluated else log.train, key)
    if not xs:
        return None
    fig, ax = _figure(title, ylabel)
    _plot(ax, xs, ys, color, gid=key.replace("_", "-"))
    _mark_resumes(ax, log)
    _legend(ax)
    fig.tight_layout()
    return fig


def lr_figure(log: RunLog, schedule: Schedule | None) -> Any | None:
    """The logged learning rates and, when known, the schedule they follow: the Trainer logs every
    ``logging_steps`` steps, so without the schedule a warmup shorter than that is invisible."""
    xs, ys = _series(log.train, "learning_rate")
    if not xs and schedule is None:
        return None
    fig, ax = _figure("Learning rate", "learning rate")
    if schedule is not None:
        if schedule.warmup_steps > 0:
            end = min(schedule.warmup_steps, schedule.max_steps)  # a warmup longer than the run ends with it
            span = ax.axvspan(0, end, color="tab:red", alpha=0.08, linewidth=0)
            span.set_label(f"warmup ({schedule.warmup_steps} steps)")
            span.set_gid("lr-warmup")
        (line,) = ax.plot(
            schedule.steps,
            schedule.rates,
            color="black",
            linestyle="--",
            linewidth=1,
            label=f"schedule ({schedule.kind}, from run.json)",
            zorder=3,
        )
        line.set_gid("lr-schedule")
    if xs:
        _plot(ax, xs, ys, "tab:red", label="logged" if schedule is not None else None, gid="learning-rate")
    _mark_resumes(ax, log)
    _legend(ax)
    fig.tight_layout()
    return fig


def throughput_figure(log: RunLog) -> Any | None:
    """Real tokens/s when known, else samples/s (the two are proportional when tokens are estimated per sample)."""
    xs, ys = _series(log.train, "tokens_per_second")
    label = "real tokens/s"
    if not xs:
        xs, ys = _series(log.train, "samples_per_second")
        label = "samples/s"
    if not xs:
        return None
    fig, ax = _figure(f"Throughput ({label}, evaluation and saving left out)", label)
    _plot(ax, xs, ys, "tab:green", gid="throughput")
    _mark_resumes(ax, log)
    _legend(ax)
    fig.tight_layout()
    return fig


# Where a step's time went (train/run/diagnostics.py), each a share of 0 to 1: (record key, legend, colour).
STEP_SHARES = (
    ("mfu", "MFU (of the device's peak)", "tab:purple"),
    ("data_wait_share", "waiting for data", "tab:red"),
    ("packing_efficiency", "packing efficiency (real tokens)", "tab:blue"),
)


def step_shares_figure(log: RunLog) -> Any | None:
    """MFU, the share of the time spent waiting for batches and the packing efficiency over the steps, on one
    axis of shares; None when the log holds none of them (a run from before they were recorded)."""
    title = "Where the time goes (rank 0, evaluation and saving left out)"
    return series_figure(log, log.train, STEP_SHARES, (title, "share"), top=1.05)


# What each checkpoint save cost (train/run/callbacks.py's checkpoint records): (record key, legend, colour).
SAVE_TIMES = (
    ("save_blocking_s", "the loop's wait", "tab:red"),
    ("save_background_s", "written behind it", "tab:blue"),
)


def saves_figure(log: RunLog) -> Any | None:
    """The seconds each checkpoint save held the training loop and the seconds written behind it (0 for a
    synchronous save: train/run/saving.py); None without checkpoint records that say them."""
    return series_figure(log, log.saves, SAVE_TIMES, ("Checkpoint saves", "seconds"))


def series_figure(
    log: RunLog,
    records: list[Record],
    series: tuple[tuple[str, str, str], ...],
    titles: tuple[str, str],
    top: float | None = None,
) -> Any | None:
    """The ``series`` (record key, legend, colour) of ``records`` over the steps on one axis from 0 (to ``top``),
    with ``titles`` (the chart's, the axis's) and the run's resumes marked; None when ``records`` hold none."""
    found = [(key, label, color, *_series(records, key)) for key, label, color in series]
    found = [entry for entry in found if entry[3]]
    if not found:
        return None
    fig, ax = _figure(*titles)
    for key, label, color, xs, ys in found:
        _plot(ax, xs, ys, color, label=label, gid=key.replace("_", "-"))
    ax.set_ylim(0, top)
    _mark_resumes(ax, log)
    _legend(ax)
    fig.tight_layout()
    return fig


def gpu_figure(log: RunLog) -> Any | None:
    """Memory used per GPU of rank 0's node, with the mean utilization on a second axis; None without GPU samples."""
    per_gpu: dict[int, tuple[list[float], list[float]]] = {}
    for record in log.train:
        for gpu in record.get("gpus") or []:
            used = number(gpu.get("mem_used_mib"))
            if used is None or not isinstance(gpu.get("index"), int):
                continue
            xs, ys = per_gpu.setdefault(gpu["index"], ([], []))
            xs.append(float(record["step"]))
            ys.append(used / 1024)
    if not per_gpu:
        return None
    fig, ax = _figure("GPU memory (NVML, rank 0's node)", "GiB used")
    for index in sorted(per_gpu):
        xs, ys = per_gpu[index]
        _plot(ax, xs, ys, f"C{index % 10}", label=f"GPU {index}", gid=f"gpu-{index}-memory")
    uxs, uys = _series(log.train, "gpu_util_pct")
    if uxs:
        twin = ax.twinx()
        twin.plot(uxs, uys, color="black", linewidth=1, linestyle=":", label="utilization % (mean)")
        twin.set_ylabel("utilization %")
        twin.set_ylim(0, 105)
    _mark_resumes(ax, log)
    _legend(ax, loc="lower right")
    fig.tight_layout()
    return fig


_ID = re.compile(r'\bid="([^"]+)"')
_REF = re.compile(r'(href="#|url\(#)([^")]+)')


def svg(fig: Any, prefix: str) -> str:
    """The figure as inline SVG (text kept as text), without the XML prolog and DOCTYPE that name external URLs.

    Every id is prefixed with ``prefix`` (the chart's name): matplotlib numbers its ids per figure (``axes_1``,
    clip paths, marker definitions), and one page holds several figures, one of them hidden at a time."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    text = buffer.getvalue()
    start = text.find("<svg")
    body = text[start:]
    # The <metadata> block names RDF/Dublin Core namespaces by URL; the page should carry no URL at all.
    head, sep, rest = body.partition("<metadata>")
    if sep:
        body = head + rest.partition("</metadata>")[2]
    body = _ID.sub(lambda m: f'id="{prefix}-{m.group(1)}"', body)
    return _REF.sub(lambda m: f"{m.group(1)}{prefix}-{m.group(2)}", body)
