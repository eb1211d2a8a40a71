"""Helpers shared by the unit tests of several modules: checkpoints as the Trainer writes them, damage done to a
file (truncated, one bit flipped), a planted pickle, a configuration of the demo corpus for tokenizer
training, the Trainer's settings with nothing on, and torch's thread count set for a while and watched."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from train.config import Config, ScheduleArguments, load_config
from train.outputs.marker import mark_complete
from train.run.trainer_settings import HEAD_WITH_ENCODER, TrainerSettings


def checkpoint(root: Path, step: int, marked: bool = True) -> Path:
    """A checkpoint as the Trainer writes one: weights, optimizer, scheduler, RNG state, trainer_state.json."""
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    save_file({"w": torch.ones(64, 64)}, str(path / "model.safetensors"))
    torch.save({"state": {0: {"exp_avg": torch.zeros(64, 64)}}}, path / "optimizer.pt")
    torch.save({"last_epoch": step}, path / "scheduler.pt")
    torch.save({"python": 1}, path / "rng_state.pth")
    (path / "config.json").write_text("{}")
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    if marked:
        mark_complete(path)
    return path


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def flipped(data: bytes, offset: int = -9) -> bytes:
    """``data`` with one bit flipped at ``offset``, its size kept: what a flaky disk or object store does."""
    changed = bytearray(data)
    changed[offset] ^= 0x01
    return bytes(changed)


def flip(path: Path, offset: int = -9) -> None:
    path.write_bytes(flipped(path.read_bytes(), offset))


class Payload:
    """A pickle whose loading would create ``marker``: what a hostile writer of a shared volume plants."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


def demo_config(**env: str) -> Config:
    """The demo corpus (200 samples) with a 120-token tokenizer vocabulary; ``env``: other MLM_* options, by name."""
    values = {
        "MLM_DEMO_SAMPLES": "200",
        "MLM_TOKENIZER_VOCAB_SIZE": "120",
        **{f"MLM_{k.upper()}": v for k, v in env.items()},
    }
    return load_config([], values)


def trainer_settings(**given: Any) -> TrainerSettings:
    """MLMTrainer's settings with nothing on - training's collator for evaluation, one held-out set, no rate or
    batch schedule, no phase, no head apart, no drift, no resumed stream, no MFU, synchronous saves, the schema's decay ratio - but ``given``."""
    plain = TrainerSettings(
        eval_collator=None,
        eval_parts=None,
        decay_ratio=ScheduleArguments.decay_ratio,
        mask_rates=None,
        batch_warmup=None,
        phase=None,
        head=HEAD_WITH_ENCODER,
        drift_batch=None,
        stream_position=None,
        stream_part=None,
        token_flops=None,
        peak=None,
        saves=None,
    )
    return dataclasses.replace(plain, **given)


def threads_in_the_probe(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """torch's thread count at each matrix product of the CPU probe, as it runs."""
    seen: list[int] = []
    product = torch.mm

    def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return product(a, b)

    monkeypatch.setattr(torch, "mm", mm)
    return seen


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's thread count ``count`` for the block, its own put back after."""
    own = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(own)
