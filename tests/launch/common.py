"""Helpers for the launcher's tests: `plan` run in-process against the shared NVML fake."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.fakes import FakeDevice, FakeNvml, no_driver, uuid_of
from train.common.errors import run_main
from train.launch import __main__ as launcher

CUDA_BUILD = "12.4"
# torchrun's stop flags at the defaults: MLM_STOP_TIMEOUT and the signals it forwards.
STOP = [
    "--shutdown-timeout",
    "270",
    "--signals-to-handle",
    "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2",
]  # the torch build the fake GPU machines have (the CPU build cannot use their GPUs)


PYTORCHJOB = {  # what training-operator (>= 1.7) sets on a PyTorchJob's pods, master 0 / workers 1..
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "auto",
    "MASTER_ADDR": "mlm-master-0",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "2",
}


def gpus_of(cc: tuple[int, int], n: int = 1, name: str = "GPU") -> FakeNvml:
    return FakeNvml([FakeDevice(uuid_of(i), name=name, cc=cc) for i in range(n)])


def run_plan(monkeypatch, capsys, env, *flags, torch_cuda=CUDA_BUILD):
    """``python -m train.launch plan`` in-process: (exit code, the JSON document or None, stderr)."""
    monkeypatch.setattr(launcher, "torch_cuda_version", lambda: torch_cuda)
    code = run_main(lambda argv: launcher.main(argv, env), ["plan", *flags])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


def plan_ok(monkeypatch, capsys, env, *flags, torch_cuda=CUDA_BUILD) -> dict:
    code, document, err = run_plan(monkeypatch, capsys, env, *flags, torch_cuda=torch_cuda)
    assert code == 0, err
    return document


def torchrun_flags(document: dict) -> list[str]:
    command = document["command"]
    assert command[0] == str(Path(sys.executable).with_name("torchrun"))
    return command[1 : command.index("-m")]


def job_flags(document: dict) -> list[str]:
    command = document["command"]
    assert command[command.index("-m") + 1] == "train.run.job"
    return command[command.index("-m") + 2 :]


__all__ = ["PYTORCHJOB", "STOP", "gpus_of", "job_flags", "no_driver", "plan_ok", "pytest", "run_plan", "torchrun_flags"]
