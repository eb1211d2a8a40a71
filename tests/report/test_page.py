"""train.report.page: the page and the PNG from a real tiny run and from synthetic partial logs, what the summary
and the captions say, escaping, and the page rendered by a real headless browser (Debian's chromium), which clicks
the loss chart's linear/log toggle and leaves screenshots for a reviewer (the test prints where)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.common.test_rollbacks import RECORDED, SPIKE
from tests.report.chromium import Chromium, near, visible
from tests.report.helpers import (
    assert_self_contained,
    charts_of,
    decode_png,
    element,
    linear_warmup,
    markers,
    resume_words,
    run_json,
    svgs,
    train_record,
    write_jsonl,
)
from train.outputs.runfiles import TRAINER_STATE, RunFiles
from train.report import plots
from train.report.page import STYLE, write_report
from train.report.runlog import load_run
from train.report.schedule import lr_schedule

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


# ---- a real tiny run -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job itself under torchrun on the demo data (800 samples, 10 steps, a log record every 2 steps)."""
    out = tmp_path_factory.mktemp("run") / "out"
    # Module-scoped, so built before the autouse fixtures scrub the caller's MLM_* options: scrubbed here too.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLM_")}
    env.update(
        MLM_CONFIG="configs/demo.yaml",
        MLM_DEMO_SAMPLES="800",
        MLM_LOGGING_STEPS="2",
        MLM_OUTPUT_DIR=str(out),
        HF_HOME=str(tmp_path_factory.mktemp("hf")),
        HF_HUB_OFFLINE="1",
    )
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    torchrun = str(Path(PYTHON).with_name("torchrun"))
    command = [torchrun, "--standalone", "--nproc-per-node", "1", "-m", "train.run.job", "--ddp_backend", "gloo"]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.slow
def test_real_run_logs_and_report(real_run: Path, tmp_path: Path):
    files = RunFiles(real_run)
    assert files.train_jsonl.is_file(), (
        "the job wrote no logs/train.jsonl: train/run/job.py must call train.run.logs.attach()"
    )
    records = [json.loads(line) for line in files.train_jsonl.read_text().splitlines()]
    events = [r["event"] for r in records]
    assert events[0] == "banner" and events.count("train") == 5 and "eval" in events, events
    # the job wrote the report at its end
    assert files.report.is_file() and files.loss_png.is_file()

    # and `entrypoint.sh report OUTPUT_DIR` rebuilds it, here on a copy
    copy = RunFiles(tmp_path / "copy")
    shutil.copytree(real_run, copy.root, ignore=shutil.ignore_patterns("checkpoint-*", "final"))
    copy.report.unlink()
    done = subprocess.run([PYTHON, "-m", "train.report", str(copy.root)], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    page = copy.report.read_text()
    charts = charts_of(page)
    # no GPU here: no gpu-memory; started by torchrun without the launcher: no launch time, so the held-out loss
    # against tokens only
    expected = ["loss", "quality-tokens", "learning-rate", "throughput", "step-shares", "grad-norm", "saves"]
    assert list(charts) == expected  # saves: the epoch's checkpoint
    assert ">finished</span>" in page and "scratch:distilbert" in page
    assert resume_words(copy.root) == []  # it did not resume
    assert_self_contained(page)
    image = decode_png(copy.loss_png)
    assert image.size[0] > 300 and len(set(image.getdata())) > 10

    # The demo warms up over 50 steps and this run has 10, logged every 2: the real Trainer's logged rates are
    # checked against the schedule transformers computes from run.json, which then shows step 1 at 0.
    schedule, caption = lr_schedule(load_run(copy.root))
    assert schedule is not None, caption
    assert (schedule.kind, schedule.warmup_steps, schedule.max_steps) == ("warmup_stable_decay", 50, 10)
    assert schedule.steps[0] == 1 and schedule.rates[0] == 0.0
    assert all(a < b for a, b in zip(schedule.rates, schedule.rates[1:], strict=False))  # still ramping up
    assert "agrees with all 5 logged learning rates" in charts["learning-rate"]
    (lr_svg,) = svgs(charts["learning-rate"])
    assert element(lr_svg, "lr-schedule") is not None and element(lr_svg, "lr-warmup") is not None
    # one evaluation: drawn as a point (a line through one point draws nothing)
    assert markers(svgs(charts["loss"])[0], "eval-loss") == 1


# ---- synthetic logs --------------------------------------------------------------------------------------------------


def test_partial_log_of_an_interrupted_resumed_run(tmp_path: Path):
    banner = {"event": "banner", "start_step": 0, "world_size": 8, "precision": "bf16", "global_batch_size": 256}
    gpus = [{"index": 0, "util_pct": 95, "mem_used_mib": 30000, "mem_total_mib": 81920}]
    records = [
        banner,
        *[train_record(s, 5.0 - s / 20, gpus=gpus, gpu_util_pct=95) for s in (10, 20, 30, 40)],
        {"event": "eval", "step": 20, "epoch": 0.2, "eval_loss": 4.2},
        {"event": "eval", "step": 40, "epoch": 0.4, "eval_loss": 4.0},
        {**banner, "start_step": 20},  # preempted after step 40, resumed from checkpoint-20
        train_record(30, 3.0),  # the replayed step: the newer line wins
        train_record(50, "nan"),  # a diverged loss, as the log writes it
    ]
    files = RunFiles(tmp_path)
    write_jsonl(files.train_jsonl, records, tail='{"event": "train", "step": 6')  # cut-off line
    path = write_report(tmp_path)
    assert path == files.report
    page = path.read_text()
    assert "interrupted or still running (no run.json)" in page
    assert list(charts_of(page)) == ["loss", "learning-rate", "throughput", "grad-norm", "gpu-memory"]
    assert "<th>resumed at step</th><td>20</td>" in page
    assert "<th>steps</th><td>50 of 100</td>" in page
    assert "<th>world size</th><td>8</td>" in page and "<th>precision</th><td>bf16</td>" in page
    assert "<th>last eval loss</th><td>4.2</td>" in page and f"<th>perplexity</th><td>{math.exp(4.2):.6g}</td>" in page
    assert "No run.json yet" in page and "Schedule and warmup not drawn: no run.json" in page
    assert_self_contained(page)
    decode_png(files.loss_png)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs", "loss.png", "report.html"]  # no temporary left


def test_a_start_from_step_0_shows_no_resume(tmp_path: Path):
    first = [{"event": "banner", "start_step": 0}, train_record(10, 4.0), train_record(20, 3.0)]
    first += [{"event": "banner", "start_step": 10}, train_record(20, 3.1), {"event": "train_end", "step": 20}]
    again = [{"event": "banner", "start_step": 0}, train_record(10, 4.5)]
    write_jsonl(RunFiles(tmp_path).train_jsonl, first + again)
    write_report(tmp_path)
    assert resume_words(tmp_path) == []


def test_loss_chart_has_a_linear_toggle(tmp_path: Path):
    records = [train_record(s, 1.9 + 8 * math.exp(-s / 8)) for s in range(5, 101, 5)]
    write_jsonl(RunFiles(tmp_path).train_jsonl, records)
    loss = charts_of(write_report(tmp_path).read_text())["loss"]
    assert re.search(r'<input type="radio" class="show-log" name="loss-scale" id="loss-scale-log" checked>', loss)
    assert re.search(r'<input type="radio" class="show-linear" name="loss-scale" id="loss-scale-linear">', loss)
    assert '<label for="loss-scale-linear">' in loss and '<label for="loss-scale-log">' in loss
    log_view, linear_view = svgs(loss)
    assert element(log_view, "loss-log-scale") is not None and element(linear_view, "loss-linear-scale") is not None
    # what the browser test clicks: the CSS that hides one of the two views
    assert re.search(r"input\.show-log:checked ~ \.scale-linear", STYLE)
    assert re.search(r"input\.show-linear:checked ~ \.scale-log", STYLE)


def test_resumed_legend_and_note_only_for_a_resumed_run(tmp_path: Path):
    steps = [train_record(s, 5.0 - s / 30) for s in range(10, 101, 10)]
    once = [{"event": "banner", "start_step": 0}, *steps]
    write_jsonl(RunFiles(tmp_path / "once").train_jsonl, once)
    write_report(tmp_path / "once")
    assert resume_words(tmp_path / "once") == [], "a run that never resumed shows no resume line, legend or note"

    resumed = [*once[:6], {"event": "banner", "start_step": 40}, *steps[3:]]
    write_jsonl(RunFiles(tmp_path / "resumed").train_jsonl, resumed)
    page = write_report(tmp_path / "resumed").read_text()
    charts = charts_of(page)
    for name in ("loss", "learning-rate", "throughput", "grad-norm"):
        for view in svgs(charts[name]):
            assert element(view, "resumed-40") is not None, name
            assert plots.RESUMED_LABEL in "".join(view.itertext()), name  # in the legend
    assert "Dotted vertical lines" in page and "<th>resumed at step</th><td>40</td>" in page


@pytest.mark.parametrize(
    ("run", "caption"),
    [
        (run_json(), "Dashed: the linear schedule from run.json (learning rate 0.001, warmup 10 steps"),
        (
            run_json(lr_scheduler_type="no-such-schedule"),
            "Schedule not drawn: transformers cannot compute &#x27;no-such",
        ),
        (
            {**run_json(), "time_budget": {"planned_steps": 40}},
            "Schedule not drawn: the time budget rebuilt it at each plan",
        ),
    ],
)
def test_the_lr_chart_says_what_its_schedule_is_or_why_there_is_none(tmp_path: Path, run: dict, caption: str):
    files = RunFiles(tmp_path)
    rate = {s: linear_warmup(s, 1e-3, 10, 100) for s in (20, 40)}
    write_jsonl(files.train_jsonl, [{**train_record(s, 3.0), "learning_rate": r} for s, r in rate.items()])
    files.run_json.write_text(json.dumps(run))
    lr = charts_of(write_report(tmp_path).read_text())["learning-rate"]
    assert f'<figcaption class="note">{caption}' in lr
    assert markers(svgs(lr)[0], "learning-rate") == 2  # the logged rates are drawn either way


def test_preempted_run_and_escaping(tmp_path: Path):
    files = RunFiles(tmp_path)
    write_jsonl(files.train_jsonl, [train_record(1, 2.0), train_record(2, 1.5)])
    run = {"status": "preempted", "config": {"dataset": "<b>data</b>", "hub_token": "***"}, "versions": {"torch": "x"}}
    files.run_json.write_text(json.dumps(run))
    page = write_report(tmp_path).read_text()
    assert 'class="status preempted">preempted</span>' in page
    assert "&lt;b&gt;data&lt;/b&gt;" in page and "<b>data</b>" not in page
    assert "<th>version: torch</th><td>x</td>" in page and "2 resolved options" in page


def test_the_page_names_the_trainer_state_it_was_drawn_from(tmp_path: Path):
    checkpoint = RunFiles(tmp_path).checkpoint(10)
    checkpoint.mkdir()
    history = [{"loss": 3.0, "step": 5}, {"eval_loss": 2.9, "step": 10}]
    (checkpoint / TRAINER_STATE).write_text(json.dumps({"log_history": history}))
    page = write_report(tmp_path).read_text()
    assert 'id="chart-loss"' in page and f"from {checkpoint / TRAINER_STATE}.</p>" in page


# ---- a real browser ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_page_renders_in_chromium(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, capsys):
    """A run that warmed up over 10 steps, logged every 5, evaluated 5 times and resumed once, in a real browser:
    the log-scale loss is shown, one click on "linear" swaps it for the linear one, the evaluations are points, the
    schedule's warmup ramp and the resume line are drawn, and nothing is fetched but the page."""
    out = tmp_path / "out"

    def lr(step: int) -> float:
        return linear_warmup(step, 1e-3, 10, 100)

    def loss(step: int) -> float:
        return 1.9 + 8 * math.exp(-step / 8)  # a fast drop, then a long converged tail

    def logged(steps: range) -> list[dict]:
        train = [{**train_record(s, loss(s)), "learning_rate": lr(s)} for s in steps]
        evals = [
            {"event": "eval", "step": s, "epoch": s / 100, "eval_loss": loss(s) + 0.1} for s in steps if s % 20 == 0
        ]
        return sorted(train + evals, key=lambda r: r["step"])

    records = [{"event": "banner", "start_step": 0}, *logged(range(5, 71, 5))]
    records += [{"event": "banner", "start_step": 60}, *logged(range(65, 101, 5))]  # stopped at 70, resumed from 60
    write_jsonl(RunFiles(out).train_jsonl, records)
    RunFiles(out).run_json.write_text(json.dumps(run_json()))
    url = write_report(out).as_uri()

    shots = tmp_path_factory.getbasetemp()  # /tmp/pytest-of-$USER/pytest-current/: kept for the last 3 sessions
    log_shot, linear_shot = shots / "report-screenshot.png", shots / "report-screenshot-linear.png"
    with capsys.disabled():
        print(f"\nreport screenshots: {log_shot} (as it opens), {linear_shot} (after clicking linear)")
    browser = Chromium(tmp_path / "profile")
    try:
        browser.open(url)
        log_view = browser.screenshot(log_shot)
        charts = browser.js("[...document.querySelectorAll('figure.chart')].map(f => f.id)")
        assert charts == ["chart-loss", "chart-learning-rate", "chart-throughput", "chart-grad-norm"]
        assert browser.js("document.querySelectorAll('figure.chart svg path').length") > 100  # drawn in the DOM
        requests = [e["params"]["request"]["url"] for e in browser.events if e["method"] == "Network.requestWillBeSent"]
        assert requests == [url], requests

        # it opens on the log scale, the linear drawing hidden; both radio buttons are there to click
        for control in ("#loss-scale-log", "#loss-scale-linear", "label[for='loss-scale-linear']"):
            assert browser.js(visible(control)), control
        assert browser.js("document.getElementById('loss-scale-log').checked")
        log_svg, linear_svg = "#chart-loss .scale-log svg", "#chart-loss .scale-linear svg"
        assert browser.js(visible(log_svg)) and not browser.js(visible(linear_svg))
        assert "Loss (log scale)" in browser.js(f"document.querySelector({json.dumps(log_svg)}).textContent")
        # the five evaluations are five painted points; the schedule's line and its warmup are drawn
        points = f"[...document.querySelectorAll({json.dumps(log_svg + ' [id$=-eval-loss] use')})]"
        assert browser.js(f"{points}.filter(u => u.getBBox().width > 0).length") == 5
        assert browser.js("document.querySelector('#learning-rate-lr-schedule path').getTotalLength()") > 100
        assert browser.js(visible("#learning-rate-lr-warmup"))
        assert plots.RESUMED_LABEL in browser.js(f"document.querySelector({json.dumps(log_svg)}).textContent")
        colours = log_view.getcolors(maxcolors=1 << 20) or []
        assert len(colours) > 50, "the screenshot is (nearly) blank"
        # matplotlib's first colours: the train loss (#1f77b4) and eval loss (#ff7f0e) were painted, not just laid out
        assert near(colours, (0x1F, 0x77, 0xB4)) > 200 and near(colours, (0xFF, 0x7F, 0x0E)) > 50

        browser.click("label[for='loss-scale-linear']")
        linear_view = browser.screenshot(linear_shot)
        assert browser.js("document.getElementById('loss-scale-linear').checked")
        assert browser.js(visible(linear_svg)) and not browser.js(visible(log_svg))
        assert "Loss (log scale)" not in browser.js(f"document.querySelector({json.dumps(linear_svg)}).textContent")
        assert linear_view.size == log_view.size and linear_view.tobytes() != log_view.tobytes()
    finally:
        browser.close()


def test_the_held_out_loss_is_drawn_against_time_and_tokens_sessions_end_to_end(tmp_path: Path):
    def evaluation(step: int, since: float, tokens: int, loss: float) -> dict:
        return {"event": "eval", "step": step, "eval_loss": loss, "since_launch_s": since, "tokens_seen": tokens}

    first = [{"event": "banner", "start_step": 0}, train_record(10, 4.0), evaluation(10, 60, 1_000_000, 3.9)]
    first += [train_record(20, 3.5), evaluation(20, 120, 2_000_000, 3.4)]
    # resumed at 20: its own launch, so its clock starts again; the chart lays it after the first session
    again = [{"event": "banner", "start_step": 20}, train_record(30, 3.0), evaluation(30, 30, 3_000_000, 3.1)]
    write_jsonl(RunFiles(tmp_path).train_jsonl, first + again)
    charts = charts_of(write_report(tmp_path).read_text())
    assert "Wall time from the launch" in charts["quality-time"]
    assert markers(svgs(charts["quality-time"])[0], "quality-since-launch-s") == 3
    assert markers(svgs(charts["quality-tokens"])[0], "quality-tokens-seen") == 3
    figure = plots.quality_figure(load_run(tmp_path), "since_launch_s", "t", "minutes", 60.0)
    xs = list(figure.axes[0].lines[0].get_xdata())
    assert xs == [1.0, 2.0, 2.5]  # minutes: 60 s, 120 s, then 120 + 30 s


def test_no_quality_chart_without_timed_evaluations(tmp_path: Path):
    write_jsonl(
        RunFiles(tmp_path).train_jsonl, [train_record(10, 4.0), {"event": "eval", "step": 10, "eval_loss": 3.9}]
    )
    charts = charts_of(write_report(tmp_path).read_text())
    assert "quality-time" not in charts and "quality-tokens" not in charts


def test_each_ranks_own_time_is_drawn_and_a_straggler_is_a_run_fact(tmp_path: Path):
    files = RunFiles(tmp_path)
    times = [{"rank_step_s/0": 0.1, "rank_step_s/1": 0.1 * (1 + step)} for step in range(3)]
    write_jsonl(files.train_jsonl, [train_record(step + 1, 2.0, **t) for step, t in enumerate(times)])
    named = {"rank": 1, "step": 3, "ratio": 3.0, "seconds": 0.3, "median_s": 0.1}
    files.run_json.write_text(json.dumps({**run_json(), "stragglers": [named]}))
    page = write_report(tmp_path).read_text()
    assert "<th>stragglers</th><td>rank 1 (from step 3: 3.0x the others&#x27; median)</td>" in page
    chart = charts_of(page)["rank-times"]
    assert "Each rank&#x27;s own work per step" in chart
    assert markers(svgs(chart)[0], "rank-step-s/0") == 3 and markers(svgs(chart)[0], "rank-step-s/1") == 3
    write_jsonl(files.train_jsonl, [train_record(1, 2.0)])  # one rank: no chart, no fact
    files.run_json.write_text(json.dumps({**run_json(), "stragglers": None}))
    page = write_report(tmp_path).read_text()
    assert "rank-times" not in charts_of(page) and "<th>stragglers</th>" not in page


def test_a_runs_rollbacks_are_a_run_fact_and_drawn_on_the_loss_chart(tmp_path: Path):
    files = RunFiles(tmp_path)
    write_jsonl(files.train_jsonl, [train_record(step, 2.0 - step / 100) for step in (10, 20, 30)])
    files.run_json.write_text(json.dumps({**run_json(), "rollbacks": RECORDED}))
    page = write_report(tmp_path).read_text()
    assert f"<th>rollbacks</th><td>{SPIKE.words()}</td>" in page
    assert page.count("rollback (where it was detected)") == 2  # the log and the linear drawings' legends
    files.run_json.write_text(json.dumps({**run_json(), "rollbacks": {"limit": 3, "made": 0, "rollbacks": []}}))
    page = write_report(tmp_path).read_text()
    assert "<th>rollbacks</th><td>none</td>" in page and "where it was detected" not in page
