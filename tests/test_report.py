"""train.report: the page and the PNG from a real tiny run and from synthetic partial logs; exit 2 without logs; the
page rendered by a real headless browser (Debian's chromium)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from train import report
from train.errors import run_main

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def decode_png(path: Path) -> Image.Image:
    with Image.open(path) as image:
        image.load()  # decodes every pixel: a truncated or corrupt file raises here
        return image.convert("RGB")


def assert_self_contained(page: str) -> None:
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I), "a resource outside the page"
    assert not re.search(r"url\((?!#)", page), "a url() that is not a reference inside the page"
    assert "<script" not in page.lower() and "<link" not in page.lower()
    assert "<!DOCTYPE svg" not in page and "<?xml" not in page


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
    for chart in ("loss", "learning-rate", "throughput", "grad-norm"):
        assert f'id="chart-{chart}"><svg' in page, chart
    assert "chart-gpu-memory" not in page  # no GPU here
    assert ">finished</span>" in page and "scratch:distilbert" in page
    assert_self_contained(page)
    image = decode_png(copy / "loss.png")
    assert image.size[0] > 300 and len(set(image.getdata())) > 10


# ---- synthetic logs --------------------------------------------------------------------------------------------------


def test_partial_log_of_an_interrupted_resumed_run(tmp_path: Path):
    banner = {"event": "banner", "start_step": 0, "world_size": 8, "precision": "bf16", "global_batch_size": 256}
    gpus = [{"index": 0, "util_pct": 95, "mem_used_mib": 30000, "mem_total_mib": 81920}]
    records = [
        banner,
        *[train_record(s, 5.0 - s / 20, gpus=gpus, gpu_util_pct=95) for s in (10, 20, 30, 40)],
        {"event": "eval", "step": 20, "epoch": 0.2, "eval_loss": 4.2},
        {**banner, "start_step": 20},  # preempted after step 40, resumed from checkpoint-20
        train_record(30, 3.0),  # the replayed step: the newer line wins
        train_record(50, "nan"),  # a diverged loss, as the log writes it
    ]
    write_jsonl(tmp_path / "logs" / "train.jsonl", records, tail='{"event": "train", "step": 6')  # cut-off line
    path = report.write_report(tmp_path)
    page = path.read_text()
    assert "interrupted or still running (no run.json)" in page
    for chart in ("loss", "learning-rate", "throughput", "grad-norm", "gpu-memory"):
        assert f'id="chart-{chart}"' in page, chart
    assert "<th>starts (resumes)</th><td>2</td>" in page
    assert "<th>steps</th><td>50 of 100</td>" in page
    log = report.load_run(tmp_path)
    assert [r["step"] for r in log.train] == [10, 20, 30, 40, 50]
    assert log.train[2]["loss"] == 3.0
    assert_self_contained(page)
    decode_png(tmp_path / "loss.png")


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


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "chromium is not installed: .ci/system-deps.sh installs it (apt-get install chromium)"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
    ]
    return subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_page_renders_in_chromium(tmp_path: Path):
    records = [train_record(s, 5.0 - s / 30) for s in range(10, 101, 10)]
    records.append({"event": "eval", "step": 100, "epoch": 1.0, "eval_loss": 1.9})
    write_jsonl(tmp_path / "logs" / "train.jsonl", records)
    page = report.write_report(tmp_path)
    url = page.as_uri()

    dom = chromium("--dump-dom", url, profile=tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    charts = re.findall(r'<figure class="chart" id="chart-([a-z-]+)"><svg', dom.stdout)
    assert charts == ["loss", "learning-rate", "throughput", "grad-norm"]
    assert dom.stdout.count("<path") > 20  # the plotted lines, axes and ticks are in the live DOM

    shot = tmp_path / "shot.png"
    done = chromium("--window-size=1400,1600", f"--screenshot={shot}", url, profile=tmp_path / "profile-shot")
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    image = decode_png(shot)
    colours = image.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50, "the screenshot is (nearly) blank"
    # matplotlib's first colour (#1f77b4) is the train-loss curve: the chart was painted, not just laid out
    near_blue = sum(n for n, (r, g, b) in colours if abs(r - 0x1F) < 40 and abs(g - 0x77) < 40 and abs(b - 0xB4) < 40)
    assert near_blue > 200, near_blue
