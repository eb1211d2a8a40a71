"""train.run.logs: JSON lines on stdout and in output_dir/logs/train.jsonl, readable text lines, the banner, GPU metrics
through a fake NVML, and the wiring into a real (tiny) Trainer."""

from __future__ import annotations

import io
import json
import sys
import time
from dataclasses import replace
from functools import partial
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
import torch
from torch import nn
from transformers import Trainer
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from tests.fakes import h100s, install, uuid_of
from train.common import console
from train.common.handoff import Handoff
from train.common.schedules import BatchWarmup, full_steps_between
from train.config import load_config
from train.outputs.facts import Masking, RunFacts
from train.outputs.location import output_location
from train.outputs.runfiles import RunFiles
from train.run import logs
from train.run.banner import TrainStart, banner

TRAIN_KEYS = {
    "event",
    "time",
    "step",
    "epoch",
    "max_steps",
    "loss",
    "learning_rate",
    "grad_norm",
    "samples_per_second",
    "tokens_per_second",
    "elapsed_s",
    "eta_s",
}


def strict_json(line: str) -> dict:
    """Parse as strict JSON: NaN/Infinity tokens (which json.dumps emits by default) are errors."""

    def refuse(token: str) -> None:
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(line, parse_constant=refuse)


def config_for(tmp_path: Path, *extra: str):
    argv = [
        "--output_dir",
        str(tmp_path / "out"),
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "4",
        "--max_steps",
        "6",
        "--logging_steps",
        "2",
        "--eval_strategy",
        "no",
        "--save_strategy",
        "no",
        "--dataloader_num_workers",
        "0",
        "--use_cpu",
        "true",
        *extra,
    ]
    return load_config(argv, environ={})


class TinyRegression(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        out = self.linear(x).squeeze(-1)
        return {"loss": ((out - labels) ** 2).mean(), "logits": out}


def samples(count: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(4, generator=generator), "labels": torch.tensor(float(i % 3))} for i in range(count)]


def attach(trainer: Trainer, config, facts: RunFacts, handoff: Handoff | None = None) -> logs.TrainingLog:
    """Our logs on ``trainer``, as train/run/job.py attaches them: the banner bound to the configuration."""
    shown = partial(banner, config, facts, handoff)
    return logs.attach(trainer, logs.callbacks(config.training, config.launch.log_format, facts, handoff, banner=shown))


def banner_shown(config, facts: RunFacts, handoff: Handoff | None = None, start: TrainStart = TrainStart()) -> str:
    """The banner as stdout shows it (its record is what logs/train.jsonl keeps)."""
    return banner(config, facts, handoff, start)[1]


def train_tiny(config, facts: RunFacts) -> Trainer:
    torch.manual_seed(0)
    trainer = Trainer(model=TinyRegression(), args=config.training, train_dataset=samples(32), eval_dataset=samples(8))
    attach(trainer, config, facts)
    trainer.train()
    trainer.evaluate()
    return trainer


FACTS = RunFacts(dataset_fingerprint="fp", train_samples=32, eval_samples=8, train_real_tokens=320)


def test_json_mode_with_a_real_trainer(tmp_path, capsys):
    config = config_for(tmp_path, "--log_format", "json")
    trainer = train_tiny(config, FACTS)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.strip()]
    records = [strict_json(line) for line in lines]  # every stdout line is a JSON object: no Trainer dict prints
    events = [r["event"] for r in records]
    assert events == ["banner", "train", "train", "train", "train_end", "eval"]
    banner = records[0]
    assert banner["world_size"] == 1 and banner["max_steps"] == 6 and banner["global_batch_size"] == 4
    assert banner["train_samples"] == 32 and banner["output_dir"] == str(tmp_path / "out")
    for record in records[1:4]:
        assert TRAIN_KEYS <= record.keys(), TRAIN_KEYS - record.keys()
        # 10 real tokens per sample (320 / 32): tokens/s follows samples/s
        assert record["tokens_per_second"] == pytest.approx(record["samples_per_second"] * 10, rel=1e-3)
    assert [r["step"] for r in records[1:4]] == [2, 4, 6]
    assert records[3]["eta_s"] == 0
    assert "eval_loss" in records[5]
    # the file holds the same records as stdout
    written = [strict_json(line) for line in RunFiles(tmp_path / "out").train_jsonl.read_text().splitlines()]
    assert written == records
    # the Trainer's own printers are gone, ours are in
    kinds = {type(cb) for cb in trainer.callback_handler.callbacks}
    assert ProgressCallback not in kinds and PrinterCallback not in kinds and logs.TrainingLog in kinds
    # TensorBoard on by default (the package is installed), its events under output_dir/logs
    assert list((tmp_path / "out" / "logs").glob("events.out.tfevents.*"))


def test_text_mode_prints_lines_and_still_writes_jsonl(tmp_path, capsys):
    config = config_for(tmp_path, "--log_format", "text", "--report_to", "none")
    train_tiny(config, FACTS)
    out, err = capsys.readouterr()
    assert "mlm-trainer  image unknown" in out and "global 4 = 1 rank(s) × 4 per device × 1 accumulation" in out
    step_lines = [line for line in out.splitlines() if "step 4/6" in line]
    assert step_lines and "loss " in step_lines[0] and "tok/s" in step_lines[0] and "eta " in step_lines[0]
    assert not any(line.startswith("{") for line in out.splitlines())
    assert "{'loss'" not in out
    assert "\r" not in out + err  # not on a terminal: no progress bar to glue lines to
    records = [strict_json(line) for line in RunFiles(tmp_path / "out").train_jsonl.read_text().splitlines()]
    assert [r["event"] for r in records].count("train") == 3
    # report_to given by the user: no TensorBoard added
    assert not list((tmp_path / "out" / "logs").glob("events.out.tfevents.*"))


def test_resolve_format():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert console.resolve_format("auto", Terminal()) == "text"
    assert console.resolve_format("auto", io.StringIO()) == "json"
    assert console.resolve_format("json", Terminal()) == "json"
    assert console.resolve_format("text", io.StringIO()) == "text"


def test_tensorboard_is_the_default_and_none_turns_it_off(tmp_path):
    from transformers.integrations import TensorBoardCallback

    def integrations(config) -> set[type]:
        trainer = Trainer(model=TinyRegression(), args=config.training, train_dataset=samples(4))
        attach(trainer, config, FACTS)
        return {type(cb) for cb in trainer.callback_handler.callbacks}

    assert TensorBoardCallback in integrations(config_for(tmp_path))
    assert TensorBoardCallback not in integrations(config_for(tmp_path, "--report_to", "none"))
    off = load_config(
        ["--output_dir", str(tmp_path), "--use_cpu", "true", "--eval_strategy", "no"], environ={"MLM_REPORT_TO": "none"}
    )
    assert TensorBoardCallback not in integrations(off)


EIGHT_H100S = Handoff(
    precision="bf16 + tf32",
    global_batch_size=128,
    batch="batch: 4 per device x 8 GPUs x 2 nodes x 2 accumulation = 128 global",
    nnodes="2",
    gpus=["NVIDIA H100 80GB HBM3"] * 8,
    gpu_uuids=[uuid_of(i) for i in range(8)],
    command=["torchrun", "-m", "train.run.job"],
)


def test_banner_json_and_text(tmp_path):
    start = TrainStart(max_steps=100, world_size=16)
    config = config_for(
        tmp_path,
        "--log_format",
        "json",
        "--bf16",
        "true",
        "--gradient_accumulation_steps",
        "2",
        "--image_revision",
        "abc",
    )
    record = strict_json(banner_shown(config, FACTS, EIGHT_H100S, start))
    assert record["event"] == "banner" and record["image_revision"] == "abc"
    # the precision the launcher decided, handed over; not re-derived from the flags
    assert record["global_batch_size"] == 4 * 16 * 2 and record["precision"] == "bf16 + tf32"
    # the installed release as its metadata names it (PyPI's wheel: 2.15.0; torch.__version__ adds "+cu132")
    assert record["versions"]["torch"] == metadata.version("torch") == torch.__version__.split("+")[0]
    text_config = config_for(tmp_path, "--log_format", "text", "--image_revision", "abc")
    facts = replace(FACTS, outputs=output_location(text_config).summary())  # as train/run/job.py hands it over
    text = banner_shown(text_config, facts, EIGHT_H100S, start)
    assert "image abc" in text and "8 GPU(s) on this node (NVIDIA H100 80GB HBM3), 2 node(s)" in text
    unlaunched = banner_shown(config_for(tmp_path, "--log_format", "text"), facts, start=start)
    assert "started without the launcher" in unlaunched and "precision  fp32" in unlaunched
    assert "steps      100" in text and str(tmp_path / "out" / "report.html") in text


def test_the_banner_says_the_masking_and_its_realised_rate(tmp_path):
    masking = Masking(
        mlm_probability=0.3, eval_mlm_probability=0.15, whole_word_mask=True, realised=0.2712, realised_on_samples=256
    )
    text = banner_shown(config_for(tmp_path, "--log_format", "text"), replace(FACTS, masking=masking))
    assert "masking    30% of words (15% for evaluation); realised 27.1% of real tokens on 256 samples" in text
    record = strict_json(banner_shown(config_for(tmp_path, "--log_format", "json"), replace(FACTS, masking=masking)))
    assert record["masking"] == {
        "mlm_probability": 0.3,
        "eval_mlm_probability": 0.15,
        "whole_word_mask": True,
        "realised": 0.2712,
        "realised_on_samples": 256,
        "final_mlm_probability": None,
    }
    unmeasured = replace(FACTS, masking=replace(masking, realised=None))
    stream = banner_shown(config_for(tmp_path, "--log_format", "text"), unmeasured)
    assert "masking    30% of words (15% for evaluation)\n" in stream
    scheduled = replace(FACTS, masking=replace(masking, final_mlm_probability=0.1))
    said = banner_shown(config_for(tmp_path, "--log_format", "text"), scheduled)
    assert "masking    30% of words, falling linearly to 10% by the end (15% for evaluation); realised 27.1%" in said


def test_the_banner_says_a_resume_on_another_number_of_ranks(tmp_path):
    config = config_for(tmp_path, "--log_format", "text")
    resumed = replace(FACTS, resumed_from_ranks=2)
    elsewhere = banner_shown(config, resumed, start=TrainStart(world_size=1, start_step=20))
    assert "resuming at step 20 (resumed from 2 ranks on 1)" in elsewhere
    same = banner_shown(config, resumed, start=TrainStart(world_size=2, start_step=20))
    assert "resuming at step 20\n" in same + "\n" and "resumed from" not in same


# ---- callback driven directly, with a fake NVML ---------------------------------------------------------------------


def fake_state(step: int, zero: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        global_step=step, max_steps=10, epoch=step / 10, is_world_process_zero=zero, num_input_tokens_seen=0
    )


ARGS = SimpleNamespace(per_device_train_batch_size=8, world_size=2, gradient_accumulation_steps=1)


def drive(callback: logs.TrainingLog, loss: float = 1.5) -> None:
    callback.on_train_begin(ARGS, fake_state(0), None)
    for step in (1, 2):
        callback.on_step_end(ARGS, fake_state(step), None)
    callback.on_log(ARGS, fake_state(2), None, logs={"loss": loss, "learning_rate": 1e-4, "grad_norm": 0.5})
    callback.on_train_end(ARGS, fake_state(2), None)


def test_gpu_metrics_from_nvml(tmp_path, monkeypatch):
    fake = h100s(3)
    for i, device in enumerate(fake.devices):
        device.util_pct, device.memory_used = 90 + i, (10 + i) * 1024**3
    nvml = install(monkeypatch, fake)
    stream = io.StringIO()
    # the launcher chose GPUs 0 and 1 of the three and handed them over by UUID
    handoff = Handoff("bf16", 16, "batch", "1", ["H100"] * 2, [uuid_of(0), uuid_of(1)], [])
    facts = RunFacts(dataset_fingerprint="fp", train_samples=1, train_real_tokens=100)  # 100 tokens a sample
    callback = logs.TrainingLog(tmp_path, "json", facts=facts, stream=stream, handoff=handoff)
    drive(callback)
    record = strict_json(stream.getvalue().splitlines()[-1])
    assert record["gpus"] == [
        {"index": 0, "util_pct": 90, "mem_used_mib": 10240, "mem_total_mib": 81920},
        {"index": 1, "util_pct": 91, "mem_used_mib": 11264, "mem_total_mib": 81920},
    ]
    assert record["gpu_mem_used_mib"] == 11264 and record["gpu_util_pct"] == 90.5
    assert record["tokens_per_second"] == pytest.approx(record["samples_per_second"] * 100, rel=1e-3)
    assert nvml.shutdowns == 1


def test_no_nvml_means_no_gpu_keys(tmp_path, monkeypatch):
    def missing() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", missing)
    stream = io.StringIO()
    drive(logs.TrainingLog(tmp_path, "json", stream=stream))
    record = strict_json(stream.getvalue().splitlines()[-1])
    assert "gpus" not in record and "gpu_mem_used_mib" not in record
    assert "tokens_per_second" not in record  # neither the Trainer's count nor tokens per sample: not invented


def test_nan_loss_stays_visible_and_valid_json(tmp_path, monkeypatch):
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: (_ for _ in ()).throw(pynvml.NVMLError(1)))
    stream = io.StringIO()
    drive(logs.TrainingLog(tmp_path, "json", stream=stream), loss=float("nan"))
    assert strict_json(stream.getvalue().splitlines()[-1])["loss"] == "nan"
    assert strict_json(RunFiles(tmp_path).train_jsonl.read_text().splitlines()[-1])["loss"] == "nan"


def test_other_ranks_write_nothing(tmp_path):
    stream = io.StringIO()
    callback = logs.TrainingLog(tmp_path, "json", stream=stream)
    callback.on_train_begin(ARGS, fake_state(0, zero=False), None)
    callback.on_log(ARGS, fake_state(2, zero=False), None, logs={"loss": 1.0})
    assert stream.getvalue() == "" and not RunFiles(tmp_path).train_jsonl.exists()


def test_exact_token_count_wins_over_the_estimate(tmp_path, monkeypatch):
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: (_ for _ in ()).throw(pynvml.NVMLError(1)))
    stream = io.StringIO()
    facts = RunFacts(dataset_fingerprint="fp", train_samples=1, train_real_tokens=1000)  # 1000 tokens a sample
    callback = logs.TrainingLog(tmp_path, "json", facts=facts, stream=stream)
    callback.on_train_begin(ARGS, fake_state(0), None)
    callback.on_step_end(ARGS, fake_state(1), None)
    callback._busy = 2.0  # two seconds of training, set directly: no timing in tests
    state = fake_state(2)
    state.num_input_tokens_seen = 500
    callback.on_log(ARGS, state, None, logs={"loss": 1.0})
    assert strict_json(stream.getvalue().splitlines()[-1])["tokens_per_second"] == 250.0


def test_text_line_format():
    line = logs._text_line(
        {
            "event": "train",
            "time": "2025-01-01T10:00:00+00:00",
            "step": 50,
            "max_steps": 100,
            "epoch": 0.5,
            "loss": 2.5,
            "learning_rate": 1e-4,
            "grad_norm": 1.25,
            "mlm_probability": 0.225,
            "tokens_per_second": 12345.6,
            "samples_per_second": 96.4,
            "mfu": 0.4123,
            "data_wait_share": 0.031,
            "gpus": [{"index": 0, "util_pct": 97, "mem_used_mib": 30720, "mem_total_mib": 81920}],
            "elapsed_s": 65,
            "eta_s": 3725,
        }
    )
    assert line == (
        "[10:00:00] step 50/100 | epoch 0.50 | loss 2.5000 | lr 1.00e-04 | grad 1.25 | masking 22.5% | 12,346 tok/s | "
        "96.4 samples/s | mfu 41.2% | data wait 3% | gpu0 97% 30.0/80 GiB | elapsed 1m05s eta 1h02m"
    )


def test_an_evaluation_is_a_line_in_words_not_a_key_dump():
    # the keys a demo run's evaluation record has (train.jsonl, transformers 5.25)
    record = {
        "event": "eval",
        "time": "2025-01-01T10:00:00+00:00",
        "step": 40,
        "epoch": 0.8,
        "eval_loss": 5.2103,
        "eval_accuracy": 0.11234,
        "eval_runtime": 12.34,
        "eval_samples_per_second": 217.941,
        "eval_steps_per_second": 2.724,
        "num_input_tokens_seen": 3328,
        "since_launch_s": 11.2,
        "train_s": 2.29,
        "tokens_seen": 3328,
    }
    assert logs._text_line(record) == (
        "[10:00:00] eval at step 40: loss 5.2103, perplexity 183.1, masked accuracy 0.112 (12.3 s)"
    )
    diverged = {**record, "eval_loss": 60.0, "eval_top5": 0.5}
    assert logs._text_line(diverged).endswith(
        "loss 60.0000, perplexity 1.14e+26, masked accuracy 0.112, top5 0.5 (12.3 s)"
    )


def test_progress_bars_only_in_text_on_a_terminal(tmp_path, monkeypatch):
    import datasets
    from transformers.utils import logging as hf_logging

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    datasets.enable_progress_bars()  # as a process starts (an earlier test in this one may have run in JSON)
    hf_logging.enable_progress_bar()
    try:
        monkeypatch.setattr(sys, "stderr", Terminal())
        assert logs.configure_console("text") == "text"
        assert datasets.is_progress_bar_enabled()
        assert any(isinstance(c, logs.QuietProgress) for c in logs.callbacks(config_for(tmp_path).training, "text"))
        assert logs.configure_console("json") == "json"
        assert not datasets.is_progress_bar_enabled() and not hf_logging.is_progress_bar_enabled()
        datasets.enable_progress_bars()
        monkeypatch.setattr(sys, "stderr", io.StringIO())  # text captured to a file: no Trainer bar between steps
        assert logs.configure_console("text") == "text"
        assert datasets.is_progress_bar_enabled()  # the data's bars end before training, on a line of their own
        assert not any(isinstance(c, logs.QuietProgress) for c in logs.callbacks(config_for(tmp_path).training, "text"))
    finally:
        datasets.enable_progress_bars()
        hf_logging.enable_progress_bar()


def test_the_banner_counts_blocks_and_the_rows_they_came_from(tmp_path):
    """MLM_MAX_EVAL_SAMPLES counts rows of text; packing cuts them into blocks: the banner says both."""
    config = config_for(tmp_path, "--log_format", "text")
    packed = replace(FACTS, train_samples=30, eval_samples=2859, train_documents=400, eval_documents=64)
    assert "30 train / 2,859 eval blocks (from 400 / 64 rows of text), 320 real tokens" in banner_shown(config, packed)
    same = replace(FACTS, train_documents=32, eval_documents=8)
    assert "32 train / 8 eval samples, 320 real tokens" in banner_shown(config, same)


def test_each_evaluation_is_a_point_of_quality_against_time(tmp_path):
    config = config_for(tmp_path, "--log_format", "json", "--report_to", "none")
    torch.manual_seed(0)
    trainer = Trainer(model=TinyRegression(), args=config.training, train_dataset=samples(32), eval_dataset=samples(8))
    launched = time.time() - 100  # as if the launcher had started 100 s ago
    handoff = Handoff("fp32", 4, "batch", "1", launched_at=launched)
    log = attach(trainer, config, FACTS, handoff)
    trainer.train()
    trainer.evaluate()
    (point,) = log.curve
    assert point["step"] == 6 and point["eval_loss"] > 0
    assert 100 <= point["since_launch_s"] < 160 and 0 < point["train_s"] < point["since_launch_s"]
    written = [json.loads(line) for line in RunFiles(tmp_path / "out").train_jsonl.read_text().splitlines()]
    assert point.items() <= written[-1].items()  # the eval record carries the same point


def test_the_eta_never_passes_a_time_budgets_deadline(tmp_path, capsys):
    """Before its plan a budgeted run's steps are the options' (far more than fit): the ETA is then the deadline's."""
    config = config_for(tmp_path, "--log_format", "json", "--max_steps", "100000", "--logging_steps", "2")
    handoff = Handoff("fp32", 4, "batch", "1", deadline=time.time() + 60.0)
    shown = partial(banner, config, FACTS, handoff)
    log = logs.TrainingLog(tmp_path / "out", "json", facts=FACTS, banner=shown, handoff=handoff)
    state = SimpleNamespace(
        is_world_process_zero=True, global_step=2, max_steps=100_000, epoch=0.0, num_input_tokens_seen=0
    )
    args = SimpleNamespace(per_device_train_batch_size=4, world_size=1, gradient_accumulation_steps=1)
    log._started, log._start_step = time.monotonic() - 1.0, 0  # 2 steps in 1 s: 50,000 s to go by the steps
    eta = log._speed(args, state)["eta_s"]
    assert 55.0 < eta <= 60.0


def test_under_a_batch_warm_up_the_eta_counts_the_full_steps_still_to_come(tmp_path):
    """The ramp's first steps are cheap: timed on them, an ETA counting steps would take the full ones to come for as
    many cheap ones and read low. It counts in full steps, the time budget's unit."""
    warmup = BatchWarmup(full=16, start=0.25, ratio=0.5, unit=2)
    log = logs.TrainingLog(tmp_path / "out", "json")
    state = SimpleNamespace(
        is_world_process_zero=True, global_step=24, max_steps=240, epoch=0.0, num_input_tokens_seen=0
    )
    args = SimpleNamespace(per_device_train_batch_size=16, world_size=1, gradient_accumulation_steps=1)
    log._started, log._start_step = time.monotonic() - 10.0, 0  # 24 of the ramp's steps in 10 s
    by_steps = log._speed(args, state)["eta_s"]
    assert by_steps == pytest.approx(10.0 / 24 * 216, rel=0.01)  # no cost given: a step is a step
    log.steps_cost = lambda start, end: full_steps_between(warmup, start, end, 240)
    log._started = time.monotonic() - 10.0
    eta = log._speed(args, state)["eta_s"]
    cost_done, cost_left = full_steps_between(warmup, 0, 24, 240), full_steps_between(warmup, 24, 240, 240)
    assert eta == pytest.approx(10.0 / cost_done * cost_left, rel=0.01)
    assert eta > 1.5 * by_steps  # the steps done cost under half a full step each
