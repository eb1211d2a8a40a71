"""What the report tests share: synthetic train.jsonl records and schedules written out independently of
transformers, and readers of the written page (its charts, their SVG elements and markers)."""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from PIL import Image

from train.outputs.runfiles import RunFiles

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
    page = RunFiles(output_dir).report.read_text().replace(str(output_dir.resolve()), "OUTPUT_DIR")
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
