"""The model matrix: every architecture users continue pre-training, through the job's own main() in this process
(one import of torch and transformers for all of them; tests/e2e/test_models.py runs a few under torchrun).

For each type, from scratch with a tokenizer of its family: train, stop on a real SIGTERM to this process at
step 2 (exit 75, checkpoint-2 saved), run again to resume and finish at step 4 with the masked-only head; then
continue pre-training from that saved final/ as a pretrained directory, masking whole words; each final/ loads with
AutoModelForMaskedLM / AutoTokenizer and fills a mask. About 6 s a type."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import tiny_env
from tests.e2e.runs import OVERRIDES, SMALL, STEPS, STOP_AT
from tools.models import ARCHITECTURES, row

pytestmark = pytest.mark.slow


def fills_a_mask(final: Path) -> None:
    from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

    tokenizer = AutoTokenizer.from_pretrained(final)
    fill = pipeline("fill-mask", model=AutoModelForMaskedLM.from_pretrained(final), tokenizer=tokenizer)
    assert len(fill(f"this is a {tokenizer.mask_token} sample")) == 5


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_scratch_train_stop_resume_then_continue_from_the_saved_model(
    tmp_path: Path, job_in_process: Any, model_type: str
) -> None:
    scratch = tmp_path / "scratch"
    options = dict(
        demo_samples="200", per_device_train_batch_size="8", max_eval_samples="16", max_steps=str(STEPS),
        save_strategy="steps", save_steps="100", logging_steps="1", log_format="json",
    )  # fmt: skip
    env = tiny_env(
        scratch,
        model_name_or_path=f"scratch:{model_type}",
        config_overrides=OVERRIDES.get(model_type, SMALL),
        **options,
    )

    exits = tmp_path / "exits"  # where a launcher reads the codes its ranks recorded (torchrun's own is 1 or 0)
    exits.mkdir()
    env["MLM_EXIT_DIR"] = str(exits)
    assert job_in_process(env, stop_at=STOP_AT) == 75
    assert (exits / "rank-0.exit").read_text() == "75"
    assert json.loads((scratch / "run.json").read_text())["status"] == "preempted"
    assert (scratch / f"checkpoint-{STOP_AT}" / ".complete").exists()

    assert job_in_process(env) == 0
    assert (exits / "rank-0.exit").read_text() == "0"  # finished: a stop signal landing after it is no crash
    state = json.loads((scratch / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    assert state["global_step"] == STEPS
    records = [json.loads(line) for line in (scratch / "logs" / "train.jsonl").read_text().splitlines()]
    assert [r["start_step"] for r in records if r.get("event") == "banner"] == [0, STOP_AT]  # resumed, not redone
    run = json.loads((scratch / "run.json").read_text())
    assert run["status"] == "finished"
    attention, head, _ = row(model_type)  # what the README's model table says of it
    assert run["model"] == {"attention": attention, "head": head, "head_weights": None} and head == "masked-only"
    fills_a_mask(scratch / "final")

    continued = tmp_path / "continued"
    pretrained = tiny_env(
        continued, model_name_or_path=str(scratch / "final"), whole_word_mask="true", **{**options, "max_steps": "2"}
    )  # the saved tokenizer's vocabulary says where words start
    pretrained.pop("MLM_CONFIG_OVERRIDES", None)
    pretrained["MLM_CONFIG_OVERRIDES"] = ""  # the demo preset's DistilBERT overrides are not this model's
    assert job_in_process(pretrained) == 0
    continued_run = json.loads((continued / "run.json").read_text())
    assert continued_run["model"]["head"] == "masked-only"
    assert continued_run["masking"]["whole_word_mask"] and 0 < continued_run["masking"]["realised"] < 0.3
    fills_a_mask(continued / "final")


@pytest.mark.parametrize(
    ("model_type", "padding"), [("roberta", "packed"), ("modernbert", "packed"), ("deberta-v2", "padding_free")]
)
def test_documents_apart_train_stop_and_resume(
    tmp_path: Path, job_in_process: Any, model_type: str, padding: str
) -> None:
    output = tmp_path / "out"
    env = tiny_env(
        output, model_name_or_path=f"scratch:{model_type}", config_overrides=OVERRIDES.get(model_type, SMALL),
        padding=padding, max_seq_length="32", demo_samples="200", per_device_train_batch_size="8",
        max_eval_samples="16", max_steps=str(STEPS), save_strategy="steps", save_steps="100", log_format="json",
    )  # fmt: skip
    assert job_in_process(env, stop_at=STOP_AT) == 75
    assert job_in_process(env) == 0
    run = json.loads((output / "run.json").read_text())
    assert run["packing"] == {"padding": padding, "documents_apart": True, "efficiency": 1.0}
    assert run["model"]["head"] == "masked-only"
    fills_a_mask(output / "final")


def test_a_model_that_cannot_keep_documents_apart_is_refused_before_any_data(
    tmp_path: Path, job_in_process: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    env = tiny_env(
        tmp_path / "out", model_name_or_path="scratch:deberta-v2", padding="packed",
        # A field the config has no default for (DeBERTa-v2-xlarge's convolution): only a mapping can set it.
        config_overrides=json.dumps({"num_hidden_layers": 2, "hidden_size": 64, "conv_kernel_size": 3}),
    )  # fmt: skip
    assert job_in_process(env) == 2
    error = capsys.readouterr().err
    assert "MLM_PADDING=packed: deberta-v2 with conv_kernel_size=3: its convolution" in error, error
    assert "use padding packed_crossing or dynamic" in error and "Tokenizing" not in error
