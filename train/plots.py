"""The report's charts (matplotlib, drawn off-screen): loss, learning rate, throughput, gradient norm, GPU memory.
Imported only when a report is written, so a training step never pays for matplotlib."""

from __future__ import annotations

import io
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from train.report import RunLog


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


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for record in records:
        value = number(record.get(key))
        if value is not None and math.isfinite(value):
            xs.append(float(record["step"]))
            ys.append(value)
    return xs, ys


def _figure(title: str, ylabel: str) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=100)
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _mark_resumes(ax: Any, log: RunLog) -> None:
    for record in log.banners:
        start = record.get("start_step")
        if isinstance(start, int) and start > 0:
            ax.axvline(start, color="grey", linestyle=":", linewidth=1)


def loss_figure(log: RunLog) -> Any:
    fig, ax = _figure("Loss", "loss")
    xs, ys = _series(log.train, "loss")
    if xs:
        ax.plot(xs, ys, label="train loss", color="tab:blue", linewidth=1.5)
    exs, eys = _series(log.evals, "eval_loss")
    if exs:
        ax.plot(exs, eys, label="eval loss", color="tab:orange", marker="o", linewidth=1.5)
    _mark_resumes(ax, log)
    if xs or exs:
        ax.legend()
    fig.tight_layout()
    return fig


def line_figure(log: RunLog, key: str, title: str, ylabel: str, color: str) -> Any | None:
    xs, ys = _series(log.train, key)
    if not xs:
        return None
    fig, ax = _figure(title, ylabel)
    ax.plot(xs, ys, color=color, linewidth=1.5)
    _mark_resumes(ax, log)
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
    ax.plot(xs, ys, color="tab:green", linewidth=1.5)
    _mark_resumes(ax, log)
    fig.tight_layout()
    return fig


def gpu_figure(log: RunLog) -> Any | None:
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
        ax.plot(xs, ys, linewidth=1.2, label=f"GPU {index}")
    uxs, uys = _series(log.train, "gpu_util_pct")
    if uxs:
        twin = ax.twinx()
        twin.plot(uxs, uys, color="black", linewidth=1, linestyle=":", label="utilization % (mean)")
        twin.set_ylabel("utilization %")
        twin.set_ylim(0, 105)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def svg(fig: Any) -> str:
    """The figure as inline SVG (text kept as text), without the XML prolog and DOCTYPE that name external URLs."""
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    plt.close(fig)
    text = buffer.getvalue()
    start = text.find("<svg")
    body = text[start:]
    # The <metadata> block names RDF/Dublin Core namespaces by URL; the page should carry no URL at all.
    head, sep, rest = body.partition("<metadata>")
    if sep:
        body = head + rest.partition("</metadata>")[2]
    return body
