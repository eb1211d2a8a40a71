"""train.report: the page and the PNG from a real tiny run and from synthetic partial logs; exit 2 without logs; the
page rendered by a real headless browser (Debian's chromium, driven over the DevTools protocol), which clicks the
loss chart's linear/log toggle and leaves screenshots for a reviewer (the test prints where)."""

from __future__ import annotations

import base64
import fcntl
import json
import math
import os
import re
import select
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from train import plots, report
from train.errors import run_main

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
SVG = "{http://www.w3.org/2000/svg}"


def decode_png(path: Path) -> Image.Image:
    with Image.open(path) as image:
        image.load()  # decodes every pixel: a truncated or corrupt file raises here
        return image.convert("RGB")


def assert_self_contained(page: str) -> None:
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I), "a resource outside the page"
    assert not re.search(r"url\((?!#)", page), "a url() that is not a reference inside the page"
    assert "<script" not in page.lower() and "<link" not in page.lower()
    assert "<!DOCTYPE svg" not in page and "<?xml" not in page
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "an id used twice: a reference would reach the wrong chart"


def write_jsonl(path: Path, records: list[dict], tail: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail, encoding="utf-8")


def train_record(step: int, loss: float | str, **extra) -> dict:
    return {
        "event": "train",
        "time": "2025-01-01T10:00:00+00:00",
        "step": step,
        "epoch": step / 100,
        "max_steps": 100,
        "loss": loss,
        "learning_rate": 1e-4 * step / 100,
        "grad_norm": 1.0,
        "samples_per_second": 100.0 + step,
        "tokens_per_second": 10000.0 + step,
        **extra,
    }


def linear_warmup(step: int, lr: float, warmup: int, total: int, offset: int = 1) -> float:
    """What the Trainer logs at ``step`` for a linear schedule, written out independently of transformers: its
    multiplier after k scheduler steps is k/warmup, then (total-k)/(total-warmup); transformers 5 logs the rate a step
    ran with (k = step - 1), transformers 4 the next one (k = step)."""
    k = step - offset
    return lr * (k / warmup if k < warmup else max(0.0, (total - k) / (total - warmup)))


def cosine_warmup(step: int, lr: float, warmup: int, total: int) -> float:
    k = step - 1
    if k < warmup:
        return lr * k / warmup
    return lr * max(0.0, 0.5 * (1 + math.cos(math.pi * (k - warmup) / (total - warmup))))


def run_json(**config: Any) -> dict:
    base = {"learning_rate": 1e-3, "warmup_steps": 10, "lr_scheduler_type": "linear", "lr_scheduler_kwargs": {}}
    return {"status": "finished", "config": {**base, **config}}


def resume_words(output_dir: Path) -> list[str]:
    """Where the written report mentions a resume, its own directory's path left out (test names hold words too)."""
    page = (output_dir / report.REPORT_NAME).read_text().replace(str(output_dir.resolve()), "OUTPUT_DIR")
    return re.findall(r".{0,30}resumed.{0,30}", page, re.I | re.S)


def charts_of(page: str) -> dict[str, str]:
    return dict(re.findall(r'<figure class="chart" id="chart-([a-z-]+)">(.*?)</figure>', page, re.S))


def svgs(chart: str) -> list[ET.Element]:
    return [ET.fromstring(m) for m in re.findall(r"<svg.*?</svg>", chart, re.S)]


def element(svg: ET.Element, gid: str) -> ET.Element | None:
    return next((e for e in svg.iter() if e.get("id", "").endswith(f"-{gid}")), None)


def markers(svg: ET.Element, gid: str) -> int:
    """How many marker symbols the series with this gid draws (matplotlib writes each as a <use>)."""
    series = element(svg, gid)
    assert series is not None, f"no series {gid!r} in the chart"
    return sum(1 for e in series.iter(f"{SVG}use"))


# ---- a real tiny run -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """The job itself under torchrun on the demo data (800 samples, 10 steps, a log record every 2 steps)."""
    out = tmp_path_factory.mktemp("run") / "out"
    env = {
        **os.environ,
        "MLM_CONFIG": "configs/demo.yaml",
        "MLM_DEMO_SAMPLES": "800",
        "MLM_LOGGING_STEPS": "2",
        "MLM_OUTPUT_DIR": str(out),
        "HF_HOME": str(tmp_path_factory.mktemp("hf")),
        "HF_HUB_OFFLINE": "1",
    }
    for name in ("MLM_LOG_FORMAT", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    torchrun = str(Path(PYTHON).with_name("torchrun"))
    command = [torchrun, "--standalone", "--nproc-per-node", "1", "-m", "train.job", "--ddp_backend", "gloo"]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.slow
def test_real_run_logs_and_report(real_run: Path, tmp_path: Path):
    jsonl = real_run / "logs" / "train.jsonl"
    assert jsonl.is_file(), "the job wrote no logs/train.jsonl: train/job.py must call train.logs.attach()"
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    events = [r["event"] for r in records]
    assert events[0] == "banner" and events.count("train") == 5 and "eval" in events, events
    # the job wrote the report at its end
    assert (real_run / "report.html").is_file() and (real_run / "loss.png").is_file()

    # and `entrypoint.sh report OUTPUT_DIR` rebuilds it, here on a copy
    copy = tmp_path / "copy"
    shutil.copytree(real_run, copy, ignore=shutil.ignore_patterns("checkpoint-*", "final"))
    (copy / "report.html").unlink()
    done = subprocess.run([PYTHON, "-m", "train.report", str(copy)], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    page = (copy / "report.html").read_text()
    charts = charts_of(page)
    assert list(charts) == ["loss", "learning-rate", "throughput", "grad-norm"]  # no GPU here: no gpu-memory
    assert ">finished</span>" in page and "scratch:distilbert" in page
    assert resume_words(copy) == []  # it did not resume
    assert_self_contained(page)
    image = decode_png(copy / "loss.png")
    assert image.size[0] > 300 and len(set(image.getdata())) > 10

    # The demo warms up over 50 steps and this run has 10, logged every 2: the real Trainer's logged rates are
    # checked against the schedule transformers computes from run.json, which then shows step 1 at 0.
    schedule, caption = report.lr_schedule(report.load_run(copy))
    assert schedule is not None, caption
    assert (schedule.kind, schedule.warmup_steps, schedule.max_steps) == ("linear", 50, 10)
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
    write_jsonl(tmp_path / "logs" / "train.jsonl", records, tail='{"event": "train", "step": 6')  # cut-off line
    path = report.write_report(tmp_path)
    page = path.read_text()
    assert "interrupted or still running (no run.json)" in page
    assert list(charts_of(page)) == ["loss", "learning-rate", "throughput", "grad-norm", "gpu-memory"]
    assert "<th>resumed at step</th><td>20</td>" in page
    assert "<th>steps</th><td>50 of 100</td>" in page
    log = report.load_run(tmp_path)
    # step 40 and its evaluation belong to the attempt that was cut off after checkpoint-20: not this model's past
    assert [r["step"] for r in log.train] == [10, 20, 30, 50] and [r["step"] for r in log.evals] == [20]
    assert log.train[2]["loss"] == 3.0 and log.resumed_at == [20]
    assert_self_contained(page)
    decode_png(tmp_path / "loss.png")


def test_a_start_from_step_0_is_a_new_run(tmp_path: Path):
    """A run started over (or restarted before its first checkpoint) appends to the same train.jsonl: the report
    shows the new run only, which did not resume."""
    first = [{"event": "banner", "start_step": 0}, train_record(10, 4.0), train_record(20, 3.0)]
    first += [{"event": "banner", "start_step": 10}, train_record(20, 3.1), {"event": "train_end", "step": 20}]
    again = [{"event": "banner", "start_step": 0}, train_record(10, 4.5)]
    write_jsonl(tmp_path / "logs" / "train.jsonl", first + again)
    log = report.load_run(tmp_path)
    assert [r["loss"] for r in log.train] == [4.5] and log.resumed_at == [] and log.summary == {}
    assert len(log.banners) == 1
    report.write_report(tmp_path)
    assert resume_words(tmp_path) == []


def test_loss_is_on_a_log_scale_with_a_linear_toggle(tmp_path: Path):
    records = [train_record(s, 1.9 + 8 * math.exp(-s / 8)) for s in range(5, 101, 5)]
    write_jsonl(tmp_path / "logs" / "train.jsonl", records)
    log = report.load_run(tmp_path)
    assert plots.loss_figure(log).axes[0].get_yscale() == "log"  # the default, also loss.png's
    assert plots.loss_figure(log, log_scale=False).axes[0].get_yscale() == "linear"

    loss = charts_of(report.write_report(tmp_path).read_text())["loss"]
    assert re.search(r'<input type="radio" class="show-log" name="loss-scale" id="loss-scale-log" checked>', loss)
    assert re.search(r'<input type="radio" class="show-linear" name="loss-scale" id="loss-scale-linear">', loss)
    assert '<label for="loss-scale-linear">' in loss and '<label for="loss-scale-log">' in loss
    log_view, linear_view = svgs(loss)
    assert element(log_view, "loss-log-scale") is not None and element(linear_view, "loss-linear-scale") is not None
    assert "Loss (log scale)" in ET.tostring(log_view, encoding="unicode")
    # what the browser test clicks: the CSS that hides one of the two views
    assert re.search(r"input\.show-log:checked ~ \.scale-linear", report.STYLE)
    assert re.search(r"input\.show-linear:checked ~ \.scale-log", report.STYLE)


@pytest.mark.parametrize(("evaluations", "drawn_as_points"), [(1, 1), (5, 5), (19, 19), (20, 0), (40, 0)])
def test_few_evaluations_are_drawn_as_points(tmp_path: Path, evaluations: int, drawn_as_points: int):
    records: list[dict] = [train_record(s, 5.0 - s / 30) for s in range(1, 101)]
    records += [{"event": "eval", "step": 1 + i * 2, "eval_loss": 4.0 - i / 50} for i in range(evaluations)]
    write_jsonl(tmp_path / "logs" / "train.jsonl", records)
    loss = charts_of(report.write_report(tmp_path).read_text())["loss"]
    for view in svgs(loss):  # the log and the linear drawing
        assert markers(view, "eval-loss") == drawn_as_points
        assert markers(view, "train-loss") == 0  # 100 log steps: a line


def test_resumed_legend_only_for_a_resumed_run(tmp_path: Path):
    steps = [train_record(s, 5.0 - s / 30) for s in range(10, 101, 10)]
    once = [{"event": "banner", "start_step": 0}, *steps]
    write_jsonl(tmp_path / "once" / "logs" / "train.jsonl", once)
    report.write_report(tmp_path / "once")
    assert resume_words(tmp_path / "once") == [], "a run that never resumed shows no resume line, legend or note"

    resumed = [*once[:6], {"event": "banner", "start_step": 40}, *steps[3:]]
    write_jsonl(tmp_path / "resumed" / "logs" / "train.jsonl", resumed)
    page = report.write_report(tmp_path / "resumed").read_text()
    charts = charts_of(page)
    for name in ("loss", "learning-rate", "throughput", "grad-norm"):
        for view in svgs(charts[name]):
            assert element(view, "resumed-40") is not None, name
            assert plots.RESUMED_LABEL in ET.tostring(view, encoding="unicode"), name  # in the legend
    assert "Dotted vertical lines" in page and "<th>resumed at step</th><td>40</td>" in page


@pytest.mark.parametrize(
    ("scheduler", "expected"),
    [
        ("linear", lambda s: linear_warmup(s, 1e-3, 10, 100)),
        ("cosine", lambda s: cosine_warmup(s, 1e-3, 10, 100)),
        ("linear-transformers-4", lambda s: linear_warmup(s, 1e-3, 10, 100, offset=0)),
    ],
)
def test_warmup_is_drawn_from_run_json_when_the_log_agrees(tmp_path: Path, scheduler: str, expected):
    """Logged every 20 steps, the 10 warmup steps leave no trace in the log; run.json's schedule shows them."""
    records = [{**train_record(s, 3.0), "learning_rate": expected(s)} for s in range(20, 101, 20)]
    write_jsonl(tmp_path / "logs" / "train.jsonl", records)
    (tmp_path / "run.json").write_text(json.dumps(run_json(lr_scheduler_type=scheduler.split("-")[0])))
    schedule, caption = report.lr_schedule(report.load_run(tmp_path))
    assert schedule is not None, caption
    assert schedule.warmup_steps == 10 and schedule.max_steps == 100
    rate = dict(zip(schedule.steps, schedule.rates, strict=True))
    ramp = [rate[s] for s in range(1, 11)]
    assert ramp[0] <= 1e-4 and all(a < b for a, b in zip(ramp, ramp[1:], strict=False)), ramp  # the warmup ramp
    assert max(schedule.rates) == pytest.approx(1e-3) and rate[100] < 1e-4
    for step in (1, 5, 11, 20, 55, 100):
        assert rate[step] == pytest.approx(expected(step), abs=1e-12), step

    (lr,) = svgs(charts_of(report.write_report(tmp_path).read_text())["learning-rate"])
    assert element(lr, "lr-schedule") is not None and element(lr, "lr-warmup") is not None
    assert markers(lr, "learning-rate") == 5  # the five logged rates, as points on the schedule
    assert "warmup (10 steps)" in ET.tostring(lr, encoding="unicode")


@pytest.mark.parametrize(
    ("run", "reason"),
    [
        (None, "no run.json"),
        (run_json(learning_rate=2e-3), "gives 0.0018 at step 20, the log 0.0009"),  # the options disagree with the log
        (run_json(lr_scheduler_type="reduce_lr_on_plateau"), "cannot compute 'reduce_lr_on_plateau'"),
        (run_json(lr_scheduler_type="no-such-schedule"), "cannot compute 'no-such-schedule'"),
    ],
)
def test_no_schedule_is_drawn_that_the_log_does_not_confirm(tmp_path: Path, run: dict | None, reason: str):
    records = [{**train_record(s, 3.0), "learning_rate": linear_warmup(s, 1e-3, 10, 100)} for s in (20, 40)]
    write_jsonl(tmp_path / "logs" / "train.jsonl", records)
    if run is not None:
        (tmp_path / "run.json").write_text(json.dumps(run))
    schedule, caption = report.lr_schedule(report.load_run(tmp_path))
    assert schedule is None and reason in caption, caption
    lr = charts_of(report.write_report(tmp_path).read_text())["learning-rate"]
    assert reason.replace("'", "&#x27;") in lr  # the chart says why
    (view,) = svgs(lr)
    assert element(view, "lr-schedule") is None and element(view, "lr-warmup") is None
    assert markers(view, "learning-rate") == 2  # the logged rates are still drawn


def test_preempted_run_and_escaping(tmp_path: Path):
    write_jsonl(tmp_path / "logs" / "train.jsonl", [train_record(1, 2.0), train_record(2, 1.5)])
    run = {"status": "preempted", "config": {"dataset": "<b>data</b>", "hub_token": "***"}, "versions": {"torch": "x"}}
    (tmp_path / "run.json").write_text(json.dumps(run))
    page = report.write_report(tmp_path).read_text()
    assert 'class="status preempted">preempted</span>' in page
    assert "&lt;b&gt;data&lt;/b&gt;" in page and "<b>data</b>" not in page


def test_falls_back_to_the_trainer_state_of_a_checkpoint(tmp_path: Path):
    history = [
        {"loss": 3.0, "learning_rate": 1e-4, "grad_norm": 2.0, "epoch": 0.5, "step": 5},
        {"eval_loss": 2.9, "epoch": 1.0, "step": 10},
        {"loss": 2.5, "learning_rate": 5e-5, "grad_norm": 1.0, "epoch": 1.0, "step": 10},
    ]
    for step in (5, 10):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(
            json.dumps({"log_history": history[: 1 if step == 5 else 3]})
        )
    log = report.load_run(tmp_path)
    assert [r["step"] for r in log.train] == [5, 10] and log.evals[0]["eval_loss"] == 2.9
    page = report.write_report(tmp_path).read_text()
    assert 'id="chart-loss"' in page and "checkpoint-*/trainer_state.json" in page


def test_no_logs_exits_2_with_one_line(tmp_path: Path, capsys):
    assert run_main(report.main, [str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mlm-trainer: error: ") and "no training logs" in err[0]
    assert not (tmp_path / "report.html").exists()
    assert run_main(report.main, [str(tmp_path / "missing")]) == 2


def test_cli_exit_code(tmp_path: Path):
    done = subprocess.run([PYTHON, "-m", "train.report", str(tmp_path)], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    usage = subprocess.run([PYTHON, "-m", "train.report"], cwd=REPO, capture_output=True, text=True)
    assert usage.returncode == 2 and "OUTPUT_DIR" in usage.stderr


# ---- a real browser ---------------------------------------------------------------------------------------------------


def above_9(fd: int) -> int:
    """The same pipe end on a descriptor above 9 (the old one closed)."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class Chromium:
    """Headless chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: it reads
    commands on its fd 3 and answers on fd 4, each message JSON ended by a NUL byte), with one page attached."""

    FLAGS = (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--remote-debugging-pipe",
    )

    def __init__(self, profile: Path, width: int = 1400, height: int = 1000) -> None:
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        assert binary, "chromium is not installed: .ci/system-deps.sh installs it (apt-get install chromium)"
        profile.mkdir(parents=True)
        self.log = profile / "chromium.log"
        commands_r, self._commands = os.pipe()
        self._replies, replies_w = os.pipe()
        # bash puts chromium's ends on fds 3 and 4, where it expects them, then becomes chromium; the ends are first
        # moved above 9 so that the wiring never closes a pipe it has just put in place
        commands_r, replies_w = (above_9(fd) for fd in (commands_r, replies_w))
        wiring = f'exec "$0" "$@" 3<&{commands_r} 4>&{replies_w} {commands_r}<&- {replies_w}>&-'
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                ["bash", "-c", wiring, binary, *self.FLAGS, f"--user-data-dir={profile}"],
                pass_fds=(commands_r, replies_w),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        os.close(commands_r)
        os.close(replies_w)
        self._buffer = b""
        self._id = 0
        self.events: list[dict] = []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Network", "Runtime"):
            self.send(f"{domain}.enable", page=True)
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self.send("Emulation.setDeviceMetricsOverride", metrics, page=True)

    def _message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._replies], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self._replies, 1 << 20) if ready else b""
            if not chunk:
                why = "timed out" if not ready else "closed the pipe"
                raise AssertionError(f"chromium {why}: {self.log.read_text(errors='replace')[-2000:]}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: dict | None = None, page: bool = False, timeout: float = 30) -> dict:
        self._id += 1
        command: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if page:
            command["sessionId"] = self.session
        os.write(self._commands, json.dumps(command).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            message = self._message(deadline)
            if message.get("id") != self._id:
                self.events.append(message)
                continue
            assert "error" not in message, (method, message["error"])
            return message["result"]

    def wait_for(self, event: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for i, message in enumerate(self.events):
                if message.get("method") == event:
                    return self.events.pop(i)
            self.events.append(self._message(deadline))

    def open(self, url: str) -> None:
        self.events.clear()
        self.send("Page.navigate", {"url": url}, page=True)
        self.wait_for("Page.loadEventFired")

    def js(self, expression: str) -> Any:
        reply = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, page=True)
        assert "exceptionDetails" not in reply, reply["exceptionDetails"]
        return reply["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click (pressed and released) on the middle of the element, scrolled into view."""
        x, y = self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView({{block: 'center'}});"
            " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            event = {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}
            self.send("Input.dispatchMouseEvent", event, page=True)

    def screenshot(self, path: Path) -> Image.Image:
        """The whole page, not only the window."""
        size = self.send("Page.getLayoutMetrics", page=True)["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}, True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return decode_png(path)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except AssertionError:
            pass  # it may close the pipe before answering
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._commands)
        os.close(self._replies)


def near(colours: list[tuple[int, tuple[int, int, int]]], rgb: tuple[int, int, int], within: int = 40) -> int:
    return sum(n for n, c in colours if all(abs(a - b) < within for a, b in zip(c, rgb, strict=True)))


def visible(selector: str) -> str:
    """A JS expression: is the element laid out and shown (not display:none, itself or an ancestor)?"""
    return f"(() => {{ const e = document.querySelector({json.dumps(selector)}); return !!e && e.getClientRects().length > 0; }})()"


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
    write_jsonl(out / "logs" / "train.jsonl", records)
    (out / "run.json").write_text(json.dumps(run_json()))
    url = report.write_report(out).as_uri()

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
