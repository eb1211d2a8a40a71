"""MLM_PUSH_TO_HUB through the front door (entrypoint.sh -> launcher -> torchrun -> rank 0), against a Hub on
loopback (tests/hub_server.py) that HF_ENDPOINT points at: what it receives, where the token goes, and what a hub
that fails leaves behind."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import run_torchrun
from tests.e2e.runs import HUB_TOKEN, REPO_ID, entrypoint, push_env
from tests.hub_server import HubServer, Repo, Request

pytestmark = pytest.mark.slow
# The test marked waits mostly waits on the hub: make test runs it beside the unit tests, not two at a time.

TOKEN = HUB_TOKEN  # the token the loopback hub (the `hub` fixture, tests/e2e/conftest.py) accepts


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


@dataclass
class Pushed:
    output: Path
    result: subprocess.CompletedProcess
    repo: Repo
    requests: list[Request]
    hub_url: str


@pytest.fixture(scope="module")
def pushed(hub: HubServer, tmp_path_factory: pytest.TempPathFactory) -> Pushed:
    hub.reset()
    output = tmp_path_factory.mktemp("push") / "out"
    env = push_env(output, hub, image_revision="rev-e2e")  # saves a checkpoint each epoch: it must stay local
    result = entrypoint(env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return Pushed(output, result, hub.repos[REPO_ID], hub.api_requests(), hub.url)


def test_the_hub_receives_exactly_final_with_its_card(pushed: Pushed) -> None:
    final = pushed.output / "final"
    assert pushed.repo.files == files_of(final)  # byte for byte
    assert {"README.md", "model.safetensors", "config.json", "tokenizer.json"} <= pushed.repo.files.keys()
    assert (pushed.output / "checkpoint-5").is_dir() and (pushed.output / "logs").is_dir()  # kept local
    assert pushed.repo.private is True and len(pushed.repo.commits) == 1  # once, from rank 0
    assert [r.path for r in pushed.requests if r.path == "/api/repos/create"] == ["/api/repos/create"]
    assert f"pushed final/ to {pushed.hub_url}/{REPO_ID}" in pushed.result.stderr


def test_the_card_carries_the_run_facts(pushed: Pushed) -> None:
    card = pushed.repo.files["README.md"].decode()
    run = json.loads((pushed.output / "run.json").read_text())
    results = json.loads((pushed.output / "all_results.json").read_text())
    assert card.startswith("---\n") and "pipeline_tag: fill-mask" in card
    assert run["dataset_fingerprint"] in card and "rev-e2e" in card
    assert f"| evaluation loss | {results['eval_loss']:.4f} |" in card
    assert f"| perplexity | {results['perplexity']:.2f} |" in card
    assert "| optimizer steps | 5 (global batch 64 samples) |" in card
    assert f"torch {run['versions']['torch']}" in card
    assert f'pipeline("fill-mask", model="{REPO_ID}")' in card
    assert run["config"]["push_to_hub"] is True  # run.json says what was asked, though the Trainer never pushed


def test_the_token_reaches_the_hub_and_nothing_else(pushed: Pushed) -> None:
    assert pushed.requests and all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in pushed.requests)
    assert TOKEN not in pushed.result.stdout + pushed.result.stderr
    for path in pushed.output.rglob("*"):  # run.json, report.html, logs, the checkpoint, final/training_args.bin
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path


def test_a_failed_push_exits_3_and_keeps_final(hub: HubServer, tmp_path: Path) -> None:
    """Through the launcher once (a rejected token's words, and the server's: tests/test_publish.py)."""
    hub.reset()
    output = tmp_path / "out"
    # The quickest run that publishes a final/: two steps, no evaluation, no checkpoint.
    cheap = {"max_steps": "2", "eval_strategy": "no", "save_strategy": "no"}
    hub.fail("create", 500, "the hub is having a bad day")
    env, said = push_env(output, hub, **cheap), "500 Internal Server Error: the hub is having a bad day"
    result = entrypoint(env=env)
    assert result.returncode == 3, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"MLM_PUSH_TO_HUB=true: pushing final/ to mlm-e2e at {hub.url} failed ({said})" in errors[0]
    assert f"the model is kept in {output / 'final'}" in errors[0]
    assert errors[0].endswith(f"then push it with: hf upload mlm-e2e {output / 'final'} --private")
    assert TOKEN not in result.stdout + result.stderr
    final = output / "final"
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= files_of(final).keys()
    assert json.loads((output / "run.json").read_text())["status"] == "finished"
    assert not hub.repos


@pytest.mark.waits  # mostly the hub's 25 s delay: make test runs it beside the unit tests
def test_an_upload_longer_than_ddp_timeout_does_not_fail_the_other_ranks(hub: HubServer, tmp_path: Path) -> None:
    """Two ranks; the hub takes longer to accept the commit than the process group's timeout. The other rank
    must not be waiting in a collective meanwhile (it would time out, and torchrun would fail the finished run)."""
    hub.reset()
    hub.delay("commit", 25.0)
    output = tmp_path / "out"
    env = push_env(output, hub, max_steps="2", eval_strategy="no", save_strategy="no", ddp_timeout="15")
    env.pop("HF_TOKEN_FILE")  # read by entrypoint.sh; the ranks here are started by torchrun directly
    env["HF_TOKEN"] = TOKEN
    result = run_torchrun(env, nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert {"model.safetensors", "README.md"} <= hub.repos[REPO_ID].files.keys()
