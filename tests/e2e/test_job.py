"""The per-rank job end to end on CPU: real torchrun (gloo), a tiny DistilBERT trained from scratch."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer

from tests.conftest import REPO, run_torchrun, tiny_env
from tests.e2e.runs import entrypoint
from train.commands.evaluate import main as evaluate
from train.outputs.verify import verify

pytestmark = pytest.mark.slow

RESULT_KEYS = {
    "train_runtime",
    "train_samples_per_second",
    "train_tokens_per_second",
    "eval_loss",
    "perplexity",
    "eval_accuracy",
}
RUN_KEYS = {
    "config",
    "versions",
    "world_size",
    "hardware",
    "seed",
    "dataset_fingerprint",
    "started",
    "ended",
    "image_revision",
    "status",
}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("run") / "out"
    # 2,000 samples (25 steps) are enough for the tiny model to learn the one demo sentence.
    env = tiny_env(
        output, image_revision="abc123", hub_token="hf_canary_job_456", demo_samples="2000", logging_steps="10"
    )
    result = run_torchrun(env)
    assert result.returncode == 0, result.stderr[-3000:]
    return output


def test_final_model_loads_back_and_predicts(finished_run: Path) -> None:
    final = finished_run / "final"
    assert (final / "model.safetensors").exists()
    model = AutoModelForMaskedLM.from_pretrained(final)
    tokenizer = AutoTokenizer.from_pretrained(final)
    inputs = tokenizer("This is a training [MASK] for multi-GPU demonstration.", return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits
    position = (inputs["input_ids"][0] == tokenizer.mask_token_id).nonzero()[0].item()
    assert logits.shape[-1] == len(tokenizer)
    assert tokenizer.decode(logits[0, position].argmax()) == "sample"  # the demo sentence is learnt
    assert not list(finished_run.glob(".final*"))  # the staging directory was renamed into place


def test_every_final_carries_its_model_card(finished_run: Path) -> None:
    """Not pushed, no tracker: the card is there all the same, with the results and the weights' digest."""
    card = (finished_run / "final" / "README.md").read_text()
    results = json.loads((finished_run / "all_results.json").read_text())
    digest = hashlib.sha256((finished_run / "final" / "model.safetensors").read_bytes()).hexdigest()
    assert "pipeline_tag: fill-mask" in card and digest in card and f"{results['eval_loss']:.4f}" in card
    assert verify(finished_run / "final", "final").startswith("final: intact")


@pytest.mark.parametrize("ranks", ["1", "2"])
def test_evaluate_scores_a_final_model_as_training_evaluated_it(
    finished_run: Path, tmp_path: Path, ranks: str, job_in_process: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same held-out text and masks: one rank gives training's own figure; two, the same within their batches'
    means (each rank's batch is a mean of its own masked tokens). Two ranks through ./entrypoint.sh; one rank's
    figure is the scoring's, not the processes': evaluate's main() in this process (a launch is about 15
    CPU-seconds of start-up)."""
    env = tiny_env(tmp_path / "scores", demo_samples="2000", nproc_per_node=ranks, log_format="text")
    model = ["--model_name_or_path", str(finished_run / "final")]
    if ranks == "1":
        capsys.readouterr()
        assert job_in_process(env, main=evaluate, args=model) == 0
        said = capsys.readouterr().err
    else:
        scored = entrypoint("evaluate", *model, env=env)
        assert scored.returncode == 0, scored.stderr[-3000:]
        said = scored.stderr
    assert "evaluated" in said and "perplexity" in said, said[-3000:]
    results = json.loads((tmp_path / "scores" / "eval_results.json").read_text())
    trained = json.loads((finished_run / "all_results.json").read_text())
    assert results["world_size"] == int(ranks) and results["eval_samples"] == trained["eval_samples"]
    assert results["eval_loss"] == pytest.approx(trained["eval_loss"], rel=1e-6 if ranks == "1" else 1e-2)
    assert results["head"] == "masked-only" and results["eval_samples_per_second"] > 0  # masked positions alone
    assert f"held-out samples of {results['data']}: loss" in said  # the data scored, named in both
    assert not (tmp_path / "scores" / "final").exists() and not list((tmp_path / "scores").glob("checkpoint-*"))


def test_results_and_run_facts(finished_run: Path) -> None:
    results = json.loads((finished_run / "all_results.json").read_text())
    assert RESULT_KEYS <= results.keys()
    assert results["train_tokens_per_second"] > 0 and 0.0 <= results["eval_accuracy"] <= 1.0
    assert results["world_size"] == 1
    facts = json.loads((finished_run / "run.json").read_text())
    assert RUN_KEYS <= facts.keys()
    assert facts["status"] == "finished" and facts["image_revision"] == "abc123"
    assert {"python", "torch", "transformers", "datasets", "accelerate"} <= facts["versions"].keys()
    assert facts["config"]["padding"] == "dynamic"
    assert facts["truncation"] == {"examples_cut": 0, "tokens_cut": 0}  # the demo sentence fits max_seq_length
    assert facts["model"] == {
        "attention": "sdpa",
        "head": "masked-only",
        "head_weights": None,
    }  # what ran, not what was asked
    banner = next(json.loads(line) for line in (finished_run / "logs" / "train.jsonl").read_text().splitlines())
    assert (banner["attention"], banner["head"]) == ("sdpa", "masked-only")
    # the rates are of the steps that ran: a global batch of rows each (the Trainer's own were of its plan)
    rows_per_step = results["train_samples_per_second"] / results["train_steps_per_second"]
    assert rows_per_step == pytest.approx(banner["global_batch_size"], rel=0.01)
    text = (finished_run / "run.json").read_text()
    assert "hf_canary_job_456" not in text and facts["config"]["hub_token"] == "***"


def test_training_records_say_where_the_time_went(finished_run: Path) -> None:
    """MFU against the CPU's measured peak, the share spent waiting for batches, and how full the dynamically
    padded batches were (train/run/diagnostics.py)."""
    records = [json.loads(line) for line in (finished_run / "logs" / "train.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["event"] == "train"]
    assert steps and all(0 < r["mfu"] <= 1 and 0 <= r["data_wait_share"] <= 1 for r in steps)
    assert all(0 < r["packing_efficiency"] < 1 and r["tokens_per_second_per_rank"] > 0 for r in steps)


def test_a_run_starved_of_data_says_so_in_one_line(
    tmp_path: Path, job_in_process: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A collator slower than the step (as a slow streamed source or a loader without workers is): one warning,
    naming what to change."""
    from train.model.collator import MaskingCollator

    collate = MaskingCollator.__call__

    def slowly(self: MaskingCollator, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        # well over a tiny step even on a loaded machine (0.05 s was under the 30 % share beside the image test)
        time.sleep(0.25)
        return collate(self, features)

    monkeypatch.setattr(MaskingCollator, "__call__", slowly)
    env = tiny_env(tmp_path / "out", max_steps="8", logging_steps="1", eval_strategy="no", dataloader_num_workers="0")
    assert job_in_process(env) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "waited for their next batch" in line]
    assert len(said) == 1 and "MLM_DATALOADER_NUM_WORKERS" in said[0]


def real_tokens_counted(output: Path) -> tuple[int, int]:
    """(the real tokens of the training split, as the banner says; the Trainer's count after the run)."""
    records = [json.loads(line) for line in (output / "logs" / "train.jsonl").read_text().splitlines()]
    banner = next(r for r in records if r["event"] == "banner")
    return banner["train_real_tokens"], json.loads((output / "all_results.json").read_text())["num_input_tokens_seen"]


def test_real_tokens_are_the_trainers_count(finished_run: Path) -> None:
    """One epoch: the Trainer counted every non-padding token of the training split once (no estimate)."""
    in_data, counted = real_tokens_counted(finished_run)
    assert counted == in_data > 0


def test_a_finished_final_is_not_overwritten(
    finished_run: Path, job_in_process: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The rank's own check (the launcher's: tests/test_outputs.py), the job's main() in this process."""
    before = (finished_run / "final" / "model.safetensors").read_bytes()
    assert job_in_process(tiny_env(finished_run)) == 2
    stderr = capsys.readouterr().err
    assert "holds a finished model in final/; set MLM_OVERWRITE_OUTPUT_DIR=true" in stderr
    assert "Traceback" not in stderr
    assert (finished_run / "final" / "model.safetensors").read_bytes() == before


def test_two_processes_under_torchrun(tmp_path: Path) -> None:
    output = tmp_path / "out"
    result = run_torchrun(tiny_env(output), nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((output / "all_results.json").read_text())["world_size"] == 2
    assert json.loads((output / "run.json").read_text())["world_size"] == 2
    # Both ranks' batches, gathered. 320 samples are 5 batches of 64 dealt to 2 ranks: accelerate's even_batches
    # gives rank 1 a third batch from the start of the epoch, so 6 x 64 samples are trained on (a fifth again).
    in_data, counted = real_tokens_counted(output)
    assert in_data < counted < 1.25 * in_data
    assert [p.name for p in output.iterdir() if p.name.startswith("final") or p.name.startswith(".final")] == ["final"]


def test_overwrite_means_a_fresh_run(tmp_path: Path, job_in_process: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The first run through the front door; the second, over it, is the job's main() in this process (the rank's
    decision; the launcher's own: tests/test_outputs.py)."""
    output = tmp_path / "out"
    env = tiny_env(output, save_strategy="steps", save_steps="3", logging_steps="2")
    first = entrypoint(env=env, cwd=REPO)
    assert first.returncode == 0, first.stderr[-3000:]
    json_stdout_is_one_object_per_line(first.stdout)
    # Each rank left its objects to the operating system at exit; the launcher dropped triton's leak report after it.
    assert "nanobind" not in first.stderr, first.stderr[-3000:]
    steps = json.loads((output / "checkpoint-5" / "trainer_state.json").read_text())["global_step"]
    capsys.readouterr()
    assert job_in_process({**env, "MLM_OVERWRITE_OUTPUT_DIR": "true"}) == 0
    again = capsys.readouterr().err
    assert "starting over" in again and "resuming from" not in again
    records = [json.loads(line) for line in (output / "logs" / "train.jsonl").read_text().splitlines()]
    banners = [r for r in records if r["event"] == "banner"]
    assert banners[-1]["start_step"] == 0 and steps == 5  # trained again from step 0, all 5 steps
    assert (output / "final" / "model.safetensors").exists() and not (output / "final.previous").exists()


def json_stdout_is_one_object_per_line(stdout: str) -> None:
    """What a log collector reads of a real run (stdout a pipe: log_format auto means JSON; logging every 2 of its 5
    steps): every stdout line parses, and each record appears once."""
    records = [json.loads(line) for line in stdout.splitlines()]  # a blank or text line fails here
    events = [r["event"] for r in records]
    assert events[0] == "banner" and events.count("eval") == 1 and events.count("train_end") == 1
    assert [r["step"] for r in records if r["event"] == "train"] == [2, 4]


def test_the_start_up_is_recorded_phase_by_phase(finished_run: Path) -> None:
    """One ``startup`` record, at the first step: every phase from the process's start (no launcher here), adding up
    to the time the first step ended, with the tokenized cache's hit or miss."""
    records = [json.loads(line) for line in (finished_run / "logs" / "train.jsonl").read_text().splitlines()]
    startups = [r for r in records if r["event"] == "startup"]
    assert len(startups) == 1, startups
    startup = startups[0]
    phases = startup["phases_s"]
    assert startup["from"] == "process start" and "launcher" not in phases
    assert list(phases) == [
        "imports", "configuration", "checks", "reading data", "tokenizer", "resume", "tokenizing", "model",
        "trainer", "to training", "first step",
    ]  # fmt: skip
    assert phases["imports"] > 0 and sum(phases.values()) == pytest.approx(startup["to_first_step_s"], abs=0.1)
    assert startup["notes"] == {"tokenizing": "not cached"}  # the module's own HF_HOME: nothing cached before


def test_a_model_averaged_with_itself_is_itself_and_verifies(finished_run: Path, tmp_path: Path) -> None:
    """``./entrypoint.sh average`` as a user types it: two models (here the same final/ twice, whose mean is itself
    bit for bit) into a final/ that loads, verifies, and keeps the tokenizer."""
    final = finished_run / "final"
    out = tmp_path / "averaged"
    done = entrypoint("average", str(final), str(final), "--output_dir", str(out), env=tiny_env(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"averaged 2 models into {out / 'final'}" in done.stderr
    assert "intact" in verify(out / "final", "averaged")
    merged, original = (AutoModelForMaskedLM.from_pretrained(d) for d in (out / "final", final))
    for (name, p), q in zip(merged.state_dict().items(), original.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    assert AutoTokenizer.from_pretrained(out / "final").mask_token == AutoTokenizer.from_pretrained(final).mask_token


@pytest.mark.parametrize("async_save", ["true", "false"])
def test_checkpoints_kept_are_the_newest_and_every_nth(tmp_path: Path, job_in_process: Any, async_save: str) -> None:
    """save_total_limit 1 with save_keep_every 4, saving every 2 of 10 steps: checkpoints 4 and 8 stay beside the
    newest, 10, each complete - behind the loop or not (the job's main() in this process)."""
    output = tmp_path / "out"
    env = tiny_env(
        output, save_strategy="steps", save_steps="2", max_steps="10", save_total_limit="1", save_keep_every="4",
        async_save=async_save, eval_strategy="no",
    )  # fmt: skip
    assert job_in_process(env) == 0
    kept = sorted(int(p.name.split("-")[1]) for p in output.glob("checkpoint-*"))
    assert kept == [4, 8, 10]
    assert all((output / f"checkpoint-{step}" / ".complete").exists() for step in kept)
