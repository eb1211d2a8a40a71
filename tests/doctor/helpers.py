"""What the doctor tests share: a faked torch.cuda (NVML is faked by tests.fakes), a fast NCCL, and one call that
runs every check the way ``python -m train.doctor`` does."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import pytest
import torch

from train.doctor import machine, network
from train.doctor.__main__ import run_checks
from train.doctor.rows import Check
from train.launch.plan import launcher_config

GIB = 2**30


def fake_torch(monkeypatch: pytest.MonkeyPatch, cuda: str | None = "12.4", count: int = 2, probe: str | None = None):
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "init", lambda: (_ for _ in ()).throw(RuntimeError("driver too old")))
    monkeypatch.setattr(machine, "probe_devices", lambda n: probe)


def fast_nccl(monkeypatch: pytest.MonkeyPatch, busbw: float = 150.0) -> list[int]:
    calls: list[int] = []

    def run(world: int) -> dict[str, float]:
        calls.append(world)
        return {"seconds": 0.01, "algbw_gbps": busbw, "busbw_gbps": busbw}

    monkeypatch.setattr(network, "nccl_allreduce", run)
    return calls


def checks(
    monkeypatch: pytest.MonkeyPatch | None = None,
    argv: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    **torch_fake,
) -> dict[str, Check]:
    """Every row by name. ``torch_fake`` (see fake_torch) is applied after the configuration is loaded, because
    TrainingArguments itself would act on a torch.cuda that claims GPUs."""
    environ = os.environ if environ is None else environ
    config = launcher_config(list(argv), environ)
    if torch_fake:
        assert monkeypatch is not None
        fake_torch(monkeypatch, **torch_fake)
    return {c.name: c for c in run_checks(config, environ, list(argv))}
