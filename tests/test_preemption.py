"""Stopping on a signal, with real signals to this process: what a rank records, when it stops, what its data
loader workers do with the stop signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from transformers import TrainerControl, TrainerState

from tests.conftest import REPO
from train.common.errors import STOP_SIGNALS
from train.run.preemption import EvaluationInterrupted, StopOnSignal, leave_signals_to_rank

ARGS = SimpleNamespace(device=torch.device("cpu"))


@pytest.fixture
def stopper() -> Iterator[StopOnSignal]:
    saved = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    try:
        yield StopOnSignal()
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def test_no_signal_no_stop(stopper: StopOnSignal) -> None:
    control = TrainerControl()
    stopper.on_step_end(ARGS, TrainerState(), control)
    assert not stopper.stopped and not control.should_save and not control.should_training_stop


@pytest.mark.parametrize("signum", STOP_SIGNALS)
def test_a_stop_signal_saves_this_step_and_stops(stopper: StopOnSignal, signum: signal.Signals) -> None:
    os.kill(os.getpid(), signum)
    assert stopper.received == signum and stopper.signal_name == signum.name
    control = TrainerControl()
    stopper.on_step_end(ARGS, TrainerState(), control)
    assert stopper.stopped and control.should_save and control.should_training_stop
    control = TrainerControl(should_evaluate=True, should_save=True)
    stopper.on_epoch_end(ARGS, TrainerState(), control)  # the step's checkpoint exists: no second save, no eval
    assert not control.should_evaluate and not control.should_save


def test_the_first_signal_is_the_one_named(stopper: StopOnSignal) -> None:
    os.kill(os.getpid(), signal.SIGUSR1)
    os.kill(os.getpid(), signal.SIGTERM)
    assert stopper.signal_name == "SIGUSR1"


def test_a_signal_during_a_save_stops_after_it_without_another(stopper: StopOnSignal) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    control = TrainerControl()
    stopper.on_save(ARGS, TrainerState(), control)
    assert stopper.stopped and control.should_training_stop and not control.should_save


def test_a_signal_during_an_evaluation_ends_it_at_once(stopper: StopOnSignal) -> None:
    stopper.on_prediction_step(ARGS, TrainerState(), TrainerControl())  # nothing asked: evaluation goes on
    os.kill(os.getpid(), signal.SIGINT)
    with pytest.raises(EvaluationInterrupted):
        stopper.on_prediction_step(ARGS, TrainerState(), TrainerControl())


def test_a_second_ctrl_c_exits_130_at_once() -> None:
    code = (
        "import os, signal, time\n"
        "from train.run.preemption import StopOnSignal\n"
        "s = StopOnSignal()\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "assert s.received == signal.SIGINT\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(30)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=60, check=False)
    assert done.returncode == 130


class Dispositions(Dataset):
    """Each item: the worker's disposition of every stop signal, as numbers (SIG_IGN is 1)."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([int(signal.getsignal(signum)) for signum in STOP_SIGNALS])


def test_loader_workers_ignore_the_stop_signals_and_still_run_the_trainers_init() -> None:
    seen: list[int] = []
    loader = DataLoader(Dispositions(), num_workers=1, worker_init_fn=seen.append)
    leave_signals_to_rank(loader)
    for batch in loader:
        assert batch.tolist() == [[int(signal.SIG_IGN)] * len(STOP_SIGNALS)]
    # the Trainer's own init ran in the worker (a copy of this list there): the partial keeps it
    assert loader.worker_init_fn.keywords["init_fn"] == seen.append
