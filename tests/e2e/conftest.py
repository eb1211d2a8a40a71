"""The end-to-end tests' fixtures: the servers a run talks to (one each, shared by the session: a Hub on loopback,
`mlflow server`; S3's are in tests/conftest.py), the k8s overlays as rendered, and the job's main() run in this
process. Starting runs through ./entrypoint.sh: tests/e2e/runs.py."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from tests.e2e.k8s_manifests import OVERLAYS, render
from tests.e2e.runs import HUB_TOKEN
from tests.hub_server import HubServer
from tests.servers import mlflow_server as start_mlflow_server


@pytest.fixture(scope="session")
def hub() -> Iterator[HubServer]:
    """A Hugging Face Hub on loopback (tests/hub_server.py) that accepts HUB_TOKEN; tests call ``hub.reset()``."""
    with HubServer(tokens={HUB_TOKEN}) as server:
        yield server


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`mlflow server` on loopback (tests/servers.py); its URL. Tests keep apart by experiment name."""
    with start_mlflow_server(tmp_path_factory.mktemp("mlflow")) as url:
        yield url


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    """Every k8s/ overlay as `kubectl kustomize` renders it."""
    return {overlay: render(overlay) for overlay in OVERLAYS}


def sigterm_at(step: int) -> Any:
    """A Trainer callback sending this process a real SIGTERM at ``step``'s end, as docker stop or an eviction
    would (transformers imported only by the tests that run the job here)."""
    from transformers import TrainerCallback

    class SigtermAt(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == step:
                os.kill(os.getpid(), signal.SIGTERM)

    return SigtermAt()


@pytest.fixture
def job_in_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A function running the job's main() here with an environment (``stop_at``: a real SIGTERM at that step's
    end), or another command's main (``main``: evaluate's, average's) on ``args``; the stop signals' handlers and
    the libraries' progress bars restored after."""
    from train.common.errors import STOP_SIGNALS, run_main
    from train.run import job

    handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    prepare = job.prepare

    def run(
        env: dict[str, str],
        stop_at: int | None = None,
        main: Callable[[list[str] | None], int] | None = None,
        args: Sequence[str] = (),
    ) -> int:
        for name in [n for n in os.environ if n.startswith("MLM_")]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            if name.startswith("MLM_"):
                monkeypatch.setenv(name, value)
        if stop_at is not None:

            def prepare_and_stop(*args: Any) -> Any:
                prepared = prepare(*args)
                prepared.trainer.add_callback(sigterm_at(stop_at))  # before the stopper: it sees the signal
                return prepared

            monkeypatch.setattr(job, "prepare", prepare_and_stop)
        try:
            return run_main(main or job.main, list(args))
        finally:
            monkeypatch.setattr(job, "prepare", prepare)

    yield run
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    # The job's JSON console turned the libraries' progress bars off for the whole process: on again, as they were.
    import datasets
    import huggingface_hub
    from transformers.utils import logging as hf_logging

    datasets.enable_progress_bars()
    hf_logging.enable_progress_bar()
    huggingface_hub.utils.enable_progress_bars()
