"""The hub push of final/ (against tests/hub_server.py on loopback), its model card, the checks made before any
training, and what the trackers are given."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import huggingface_hub.constants
import pytest
import yaml

from tests.common.test_rollbacks import RECORDED, SPIKE
from tests.hub_server import USER, HubServer
from train.common.errors import EXIT_CONFIG, EXIT_ENVIRONMENT, ConfigError, EnvironmentProblem
from train.config import Config, load_config
from train.outputs.facts import RunFacts
from train.outputs.record import RunRecord
from train.outputs.runfiles import RunFiles
from train.publish import CardTarget, final_metrics, model_card, publish_run, push_final, tracker_params

TOKEN = "hf_canary_unit_789"
RESULTS = {
    "eval_loss": 2.3456,
    "perplexity": 10.44,
    "eval_accuracy": 0.25,
    "train_tokens_per_second": 1234.5,
    "train_runtime": 3.0,
    "world_size": 1,
    "train_samples": 320,
    "eval_samples": 80,
}


@pytest.fixture(scope="session")
def hub() -> Iterator[HubServer]:
    with HubServer(tokens={TOKEN}) as server:
        yield server


@pytest.fixture
def online(hub: HubServer, monkeypatch: pytest.MonkeyPatch) -> HubServer:
    """huggingface_hub pointed at the loopback hub (its constants are read at import), with the token in HF_TOKEN."""
    hub.reset()
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return hub


def push_config(tmp_path: Path, **env: str) -> Config:
    options = {"output_dir": str(tmp_path), "push_to_hub": "true", "hub_model_id": "mlm-unit", **env}
    return load_config([], {"HF_TOKEN": TOKEN, **{f"MLM_{k.upper()}": v for k, v in options.items()}})


def fake_final(output_dir: Path) -> Path:
    final = output_dir / "final"
    final.mkdir(parents=True)
    (final / "config.json").write_text('{"model_type": "distilbert"}')
    (final / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (final / "tokenizer_config.json").write_text('{"mask_token": "[MASK]"}')
    return final


def facts(config: Config) -> dict:
    recorded = RunFacts(dataset_fingerprint="fp-0123abcd")
    run = RunRecord(config, RunFiles(config.training.output_dir), recorded, None, "t0").document("finished")
    return json.loads(json.dumps(run, default=str))  # as run.json holds it


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


# ---- before any training --------------------------------------------------------------------------------------


def test_the_trainer_is_told_not_to_push(tmp_path: Path, online: HubServer) -> None:
    """The job pushes final/; a Trainer built from the config neither creates the repo nor uploads on save."""
    from transformers import DistilBertConfig, DistilBertForMaskedLM, Trainer

    config = push_config(tmp_path, eval_strategy="no", use_cpu="true")
    assert config.push_to_hub is True and config.training.push_to_hub is False
    assert config.as_dict()["push_to_hub"] is True  # run.json and plan show what was asked
    model = DistilBertForMaskedLM(DistilBertConfig(n_layers=1, n_heads=2, dim=16, hidden_dim=32, vocab_size=64))
    trainer = Trainer(model=model, args=config.training)
    trainer.save_model(str(tmp_path / "saved"))
    assert online.requests == []
    assert not load_config([], {"MLM_OUTPUT_DIR": str(tmp_path)}).push_to_hub


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MLM_HUB_MODEL_ID": ""}, r"MLM_PUSH_TO_HUB=true: set MLM_HUB_MODEL_ID to the repository"),
        ({"MLM_HUB_MODEL_ID": "a/b/c"}, r"MLM_HUB_MODEL_ID='a/b/c': expected name or namespace/name"),
        ({"HF_HUB_OFFLINE": "1"}, r"HF_HUB_OFFLINE is set: unset it \(a push needs the hub\)"),
        ({"HF_TOKEN": ""}, r"MLM_PUSH_TO_HUB=true: no hub token; set HF_TOKEN \(or HF_TOKEN_FILE"),
    ],
)
def test_a_push_that_could_not_work_fails_before_training(tmp_path: Path, env: dict, message: str) -> None:
    environ = {"MLM_PUSH_TO_HUB": "true", "MLM_HUB_MODEL_ID": "me/model", "HF_TOKEN": TOKEN, "HF_HOME": str(tmp_path)}
    environ.update(env)
    with pytest.raises(ConfigError, match=message) as raised:
        load_config([], {k: v for k, v in environ.items() if v})
    assert raised.value.exit_code == EXIT_CONFIG and TOKEN not in str(raised.value)


def test_the_token_may_come_from_the_option_or_the_token_file(tmp_path: Path) -> None:
    base = {"MLM_PUSH_TO_HUB": "true", "MLM_HUB_MODEL_ID": "me/model", "HF_HOME": str(tmp_path / "home")}
    assert load_config(["--hub_token", TOKEN], base).push_to_hub
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    assert load_config([], {**base, "HF_TOKEN_PATH": str(token_file)}).push_to_hub
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "token").write_text(TOKEN)  # where `hf auth login` stores it
    assert load_config([], base).push_to_hub


# ---- the push -------------------------------------------------------------------------------------------------


def test_push_uploads_exactly_final_and_its_card(tmp_path: Path, online: HubServer) -> None:
    config = push_config(tmp_path, hub_private_repo="true")
    final = fake_final(tmp_path)
    (tmp_path / "run.json").write_text("{}")  # beside final/, never pushed
    run = facts(config)
    url = push_final(config, final, run, RESULTS, step=7)
    repo = online.repos[f"{USER}/mlm-unit"]
    assert url == f"{online.url}/{USER}/mlm-unit" and repo.private is True
    assert repo.files == files_of(final) and "README.md" in repo.files  # the card is written into final/ too
    assert [c["paths"] for c in repo.commits] == [sorted(files_of(final))]
    assert all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in online.api_requests())

    push_final(config, final, run, RESULTS, step=7)  # the same final/ again: nothing new to commit
    assert len(repo.commits) == 1


def test_a_repo_id_with_its_namespace_is_kept(tmp_path: Path, online: HubServer) -> None:
    config = push_config(tmp_path, hub_model_id="team/mlm-unit")
    push_final(config, fake_final(tmp_path), facts(config), RESULTS, step=1)
    assert list(online.repos) == ["team/mlm-unit"] and online.repos["team/mlm-unit"].private is None


@pytest.mark.parametrize(
    ("failure", "said", "fix"),
    [
        ("server", "500 Internal Server Error: injected failure", "try again later"),
        ("token", "401 Unauthorized: Invalid credentials", "check that the token (HF_TOKEN, HF_TOKEN_FILE"),
    ],
)
def test_a_failed_push_is_exit_3_and_keeps_final(
    tmp_path: Path, online: HubServer, monkeypatch: pytest.MonkeyPatch, failure: str, said: str, fix: str
) -> None:
    if failure == "server":
        online.fail("create", 500)
    else:
        monkeypatch.setenv("HF_TOKEN", "hf_not_this_one")
    config = push_config(tmp_path)
    final = fake_final(tmp_path)
    before = files_of(final)
    with pytest.raises(EnvironmentProblem) as raised:
        push_final(config, final, facts(config), RESULTS, step=3)
    message = str(raised.value)
    assert raised.value.exit_code == EXIT_ENVIRONMENT and "\n" not in message
    assert message.startswith(f"MLM_PUSH_TO_HUB=true: pushing final/ to mlm-unit at {online.url} failed ({said}")
    assert fix in message
    assert message.endswith(f"then push it with: hf upload mlm-unit {final}")
    assert files_of(final) == before and not online.repos
    assert "hf_not_this_one" not in message


def test_publish_run_without_a_destination_writes_the_card_only(tmp_path: Path) -> None:
    config = load_config([], {"MLM_OUTPUT_DIR": str(tmp_path), "MLM_REPORT_TO": "none"})
    final = fake_final(tmp_path)
    before = files_of(final)
    publish_run(config, RunFiles(tmp_path), step=5)
    after = files_of(final)
    assert after.keys() - before.keys() == {"README.md"} and all(after[name] == data for name, data in before.items())
    assert "| optimizer steps | 5 " in after["README.md"].decode()


# ---- what is said about the model ---------------------------------------------------------------------------


def card_parts(text: str) -> tuple[dict, str]:
    _, front, body = text.split("---\n", 2)
    return yaml.safe_load(front), body


def test_the_card_carries_the_run_facts(tmp_path: Path) -> None:
    config = push_config(tmp_path, image_revision="rev-42", model_name_or_path="scratch:distilbert")
    metadata, body = card_parts(
        model_card(
            config.as_dict(), config.sources, facts(config), RESULTS, step=25, target=CardTarget("tester/mlm-unit")
        )
    )
    assert metadata["library_name"] == "transformers" and metadata["pipeline_tag"] == "fill-mask"
    assert "base_model" not in metadata and "datasets" not in metadata  # from scratch, on the demo data
    for fact in ("fp-0123abcd", "rev-42", "| evaluation loss | 2.3456 |", "| perplexity | 10.44 |", "25 (global batch"):
        assert fact in body
    assert "torch " in body and "transformers " in body  # versions
    assert 'pipeline("fill-mask", model="tester/mlm-unit")' in body
    assert "| rollbacks | none recorded |" in body  # a run.json without the record
    rolled = {**facts(config), "rollbacks": RECORDED, "stragglers": []}
    _, body = card_parts(model_card(config.as_dict(), config.sources, rolled, RESULTS, step=25))
    assert f"| rollbacks | {SPIKE.words()} |" in body


def test_the_card_says_how_far_an_adapted_encoder_moved_and_warns_past_the_threshold(tmp_path: Path) -> None:
    config = push_config(tmp_path)
    kept = card_parts(
        model_card(config.as_dict(), config.sources, facts(config), {**RESULTS, "eval_encoder_cosine": 0.93}, step=3)
    )[1]
    assert "| encoder drift (held-out embeddings' cosine to the starting model) | 0.930 |" in kept
    moved = card_parts(
        model_card(config.as_dict(), config.sources, facts(config), {**RESULTS, "eval_encoder_cosine": 0.41}, step=3)
    )[1]
    assert "**0.410: below 0.8, the encoder moved far from the model it was adapted from**" in moved
    assert "not measured" in card_parts(model_card(config.as_dict(), config.sources, facts(config), RESULTS, step=3))[1]


def test_the_card_names_a_hub_base_model_and_dataset_and_no_secret(tmp_path: Path) -> None:
    config = load_config(
        ["--hub_token", TOKEN],
        {
            "MLM_PUSH_TO_HUB": "true",
            "MLM_HUB_MODEL_ID": "me/m",
            "MLM_DATASET": "wikitext",
            "MLM_OUTPUT_DIR": str(tmp_path),
        },
    )
    text = model_card(config.as_dict(), config.sources, facts(config), RESULTS, step=1)
    metadata, body = card_parts(text)
    assert metadata["base_model"] == "distilbert-base-uncased" and metadata["datasets"] == ["wikitext"]
    assert TOKEN not in text and "hub_token" not in body


def test_the_card_is_its_template_filled(tmp_path: Path) -> None:
    """card.md (shipped inside train/publish, which the image copies whole) holds the fixed text; every
    placeholder is filled and every fixed line is kept."""
    template = resources.files("train.publish").joinpath("card.md").read_text(encoding="utf-8")
    config = push_config(tmp_path, dataset_config_name="wikitext-2-raw-v1", dataset="wikitext")
    text = model_card(
        config.as_dict(), config.sources, facts(config), RESULTS, step=3, target=CardTarget("me/m", mask="<mask>")
    )
    assert "${" in template and "$" not in text
    assert [line for line in template.splitlines() if "$" not in line] == [
        line for line in text.splitlines() if line in template.splitlines()
    ]
    _, body = card_parts(text)
    assert "| dataset | `wikitext` (config `wikitext-2-raw-v1`) |" in body
    assert 'fill_mask("This is a training <mask> for multi-GPU demonstration.")' in body
    assert "| model | `distilbert-base-uncased, from its pretrained weights on the hub` |" in body


def test_trackers_get_the_job_options_facts_and_final_metrics(tmp_path: Path) -> None:
    config = push_config(tmp_path, image_revision="rev-42", padding="packed")
    params = tracker_params(config.as_dict(), facts(config), RESULTS)
    assert params["padding"] == "packed" and params["dataset_fingerprint"] == "fp-0123abcd"
    assert params["image_revision"] == "rev-42" and params["train_samples"] == 320 and params["push_to_hub"] is True
    assert "versions.torch" in params and None not in params.values()
    assert "stragglers" not in params  # one rank: nothing compared
    named = {"rank": 1, "step": 40, "ratio": 2.5, "seconds": 0.25, "median_s": 0.1}
    assert tracker_params(config.as_dict(), {**facts(config), "stragglers": []}, RESULTS)["stragglers"] == "none"
    params = tracker_params(config.as_dict(), {**facts(config), "stragglers": [named]}, RESULTS)
    assert params["stragglers"] == "rank 1 (from step 40: 2.5x the others' median)"
    rolled = tracker_params(config.as_dict(), {**facts(config), "rollbacks": RECORDED}, RESULTS)
    assert rolled["rollbacks"] == SPIKE.words()
    metrics = final_metrics({**RESULTS, "perplexity": float("inf")})
    assert metrics["eval_loss"] == 2.3456 and "perplexity" not in metrics and "train_samples" not in metrics


def test_several_trackers_are_split(tmp_path: Path) -> None:
    """report_to is one string to argparse: MLM_REPORT_TO=mlflow,wandb would reach the Trainer as one name."""
    assert load_config([], {"MLM_REPORT_TO": "mlflow,wandb"}).training.report_to == ["mlflow", "wandb"]
    path = tmp_path / "job.yaml"
    path.write_text("report_to: tensorboard, mlflow\n")
    assert load_config([], {"MLM_CONFIG": str(path)}).training.report_to == ["tensorboard", "mlflow"]
    assert load_config([], {"MLM_REPORT_TO": "none"}).training.report_to == []
    assert load_config([], {}).training.report_to == ["tensorboard"]
