"""train.report.plots: each chart from synthetic logs, read back from its SVG: the loss's log scale, few points drawn
as points, the schedule and its warmup, the resume lines, and ids unique per chart."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.report.helpers import element, linear_warmup, markers, train_record, write_jsonl
from train.outputs.runfiles import RunFiles
from train.report import plots
from train.report.runlog import RunLog, load_run
from train.report.schedule import Schedule


def logged(tmp_path: Path, records: list[dict]) -> RunLog:
    write_jsonl(RunFiles(tmp_path).train_jsonl, records)
    return load_run(tmp_path)


def drawn(figure: object, prefix: str = "chart") -> ET.Element:
    return ET.fromstring(plots.svg(figure, prefix))


def test_loss_is_on_a_log_scale_by_default(tmp_path: Path):
    log = logged(tmp_path, [train_record(s, 1.9 + 8 * math.exp(-s / 8)) for s in range(5, 101, 5)])
    assert plots.loss_figure(log).axes[0].get_yscale() == "log"  # the default, also loss.png's
    assert plots.loss_figure(log, log_scale=False).axes[0].get_yscale() == "linear"
    view = drawn(plots.loss_figure(log), "loss-log")
    assert element(view, "loss-log-scale") is not None
    assert "Loss (log scale)" in ET.tostring(view, encoding="unicode")


def test_a_loss_never_positive_is_drawn_linear(tmp_path: Path):
    """A log axis cannot show it: the chart says "Loss", not "Loss (log scale)"."""
    log = logged(tmp_path, [train_record(s, -1.0) for s in (1, 2, 3)])
    figure = plots.loss_figure(log, log_scale=True)
    assert figure.axes[0].get_yscale() == "linear" and figure.axes[0].get_title() == "Loss"


@pytest.mark.parametrize(("evaluations", "drawn_as_points"), [(1, 1), (5, 5), (19, 19), (20, 0), (40, 0)])
def test_few_evaluations_are_drawn_as_points(tmp_path: Path, evaluations: int, drawn_as_points: int):
    records: list[dict] = [train_record(s, 5.0 - s / 30) for s in range(1, 101)]
    records += [{"event": "eval", "step": 1 + i * 2, "eval_loss": 4.0 - i / 50} for i in range(evaluations)]
    log = logged(tmp_path, records)
    for scale in (True, False):  # the log and the linear drawing
        view = drawn(plots.loss_figure(log, log_scale=scale))
        assert markers(view, "eval-loss") == drawn_as_points
        assert markers(view, "train-loss") == 0  # 100 log steps: a line


def test_lr_chart_draws_the_schedule_and_its_warmup(tmp_path: Path):
    log = logged(
        tmp_path, [{**train_record(s, 3.0), "learning_rate": linear_warmup(s, 1e-3, 10, 100)} for s in (20, 40)]
    )
    steps = list(range(1, 101))
    schedule = Schedule("linear", 10, 100, steps, [linear_warmup(s, 1e-3, 10, 100) for s in steps])
    view = drawn(plots.lr_figure(log, schedule))
    assert element(view, "lr-schedule") is not None and element(view, "lr-warmup") is not None
    assert markers(view, "learning-rate") == 2  # the logged rates, as points on the schedule
    text = ET.tostring(view, encoding="unicode")
    assert "warmup (10 steps)" in text and "schedule (linear, from run.json)" in text

    alone = drawn(plots.lr_figure(log, None))  # no schedule: the logged rates only
    assert element(alone, "lr-schedule") is None and element(alone, "lr-warmup") is None
    assert markers(alone, "learning-rate") == 2


def test_charts_without_data_are_left_out(tmp_path: Path):
    log = logged(tmp_path, [{"event": "train", "step": 1, "loss": 2.0}])
    assert plots.lr_figure(log, None) is None and plots.throughput_figure(log) is None
    assert plots.gpu_figure(log) is None and plots.line_figure(log, "grad_norm", "t", "y", "red") is None


def test_throughput_falls_back_to_samples_per_second(tmp_path: Path):
    log = logged(tmp_path, [{"event": "train", "step": s, "samples_per_second": 10.0} for s in (1, 2)])
    assert "samples/s" in plots.throughput_figure(log).axes[0].get_title()


def test_where_the_time_goes_draws_the_shares_the_records_carry(tmp_path: Path):
    records = [train_record(s, 2.0, mfu=0.3, data_wait_share=0.1) for s in (1, 2)]  # packing efficiency unlogged
    view = drawn(plots.step_shares_figure(logged(tmp_path, records)))
    assert element(view, "mfu") is not None and element(view, "data-wait-share") is not None
    assert element(view, "packing-efficiency") is None
    assert plots.step_shares_figure(logged(tmp_path / "old", [train_record(1, 2.0)])) is None


def test_the_saves_chart_draws_the_loops_wait_and_the_write_behind_it(tmp_path: Path):
    saves = [{"event": "checkpoint", "step": s, "save_blocking_s": 0.1, "save_background_s": 3.5} for s in (10, 20)]
    figure = plots.saves_figure(logged(tmp_path, [train_record(s, 2.0) for s in (10, 20)] + saves))
    view = drawn(figure)
    assert markers(view, "save-blocking-s") == 2 and markers(view, "save-background-s") == 2
    assert figure.axes[0].get_ylim()[0] == 0  # seconds from 0
    assert plots.saves_figure(logged(tmp_path / "none", [train_record(1, 2.0)])) is None  # no save: no chart


def test_gpu_memory_per_gpu(tmp_path: Path):
    gpus = [{"index": i, "mem_used_mib": 1024 * (i + 1)} for i in (0, 1)] + [{"index": "x", "mem_used_mib": 1}]
    log = logged(tmp_path, [train_record(s, 2.0, gpus=gpus, gpu_util_pct=90) for s in (1, 2)])
    view = drawn(plots.gpu_figure(log))
    assert element(view, "gpu-0-memory") is not None and element(view, "gpu-1-memory") is not None


def test_resume_lines_only_where_the_run_resumed(tmp_path: Path):
    steps = [train_record(s, 5.0 - s / 30) for s in range(10, 101, 10)]
    once = logged(tmp_path / "once", [{"event": "banner", "start_step": 0}, *steps])
    resumed = logged(tmp_path / "resumed", [*steps[:5], {"event": "banner", "start_step": 40}, *steps[3:]])
    for make in (
        lambda log: plots.loss_figure(log),
        lambda log: plots.lr_figure(log, None),
        lambda log: plots.throughput_figure(log),
        lambda log: plots.line_figure(log, "grad_norm", "Gradient norm", "grad norm", "tab:brown"),
    ):
        assert plots.RESUMED_LABEL not in ET.tostring(drawn(make(once)), encoding="unicode")
        view = drawn(make(resumed))
        assert element(view, "resumed-40") is not None
        assert plots.RESUMED_LABEL in ET.tostring(view, encoding="unicode")  # in the legend


def test_svg_ids_are_prefixed_and_the_prolog_dropped(tmp_path: Path):
    """Two figures on one page: matplotlib numbers ids per figure, so each chart's are prefixed with its name, and
    every reference inside it follows."""
    log = logged(tmp_path, [train_record(s, 2.0) for s in range(1, 30)])
    first, second = plots.svg(plots.loss_figure(log), "a"), plots.svg(plots.loss_figure(log), "b")
    assert first.startswith("<svg") and "<metadata>" not in first and "http://purl.org" not in first
    ids = re.findall(r'\bid="([^"]+)"', first + second)
    assert ids and len(ids) == len(set(ids)) and all(i.startswith(("a-", "b-")) for i in ids)
    for target in re.findall(r'(?:href="#|url\(#)([^")]+)', first):
        assert target.startswith("a-") and f'id="{target}"' in first, target


def test_a_mixtures_loss_per_source_is_drawn_beside_the_total(tmp_path: Path):
    evals = [{"event": "eval", "step": s, "eval_loss": 5.0 - s / 100, "eval_news_loss": 4.0 - s / 100,
              "eval_legal_loss": 6.0 - s / 100, "eval_runtime": 1.0} for s in (50, 100)]  # fmt: skip
    log = logged(tmp_path, [train_record(s, 6.0) for s in range(10, 101, 10)] + evals)
    assert plots.sources_evaluated(log) == ["news", "legal"]
    figure = plots.loss_figure(log)
    labels = [line.get_label() for line in figure.axes[0].lines]
    assert labels == ["train loss", "eval loss", "eval loss: news", "eval loss: legal"]
    assert figure.axes[0].lines[3].get_linestyle() == "--" and list(figure.axes[0].lines[3].get_ydata()) == [5.5, 5.0]
    assert markers(drawn(figure), "eval-loss-legal") == 2


def test_an_adapted_encoders_drift_is_drawn_from_its_evaluations(tmp_path: Path):
    evals = [{"event": "eval", "step": s, "eval_loss": 3.0, "eval_encoder_cosine": 1 - s / 1000} for s in (50, 100)]
    log = logged(tmp_path, [train_record(s, 6.0) for s in range(10, 101, 10)] + evals)
    figure = plots.line_figure(log, "eval_encoder_cosine", "drift", "cosine", "tab:green", evaluated=True)
    assert figure is not None and list(figure.axes[0].lines[0].get_ydata()) == [0.95, 0.9]
    assert plots.line_figure(log, "eval_encoder_cosine", "drift", "cosine", "tab:green") is None  # not a train key
