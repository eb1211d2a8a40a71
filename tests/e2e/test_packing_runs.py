"""The padding modes that keep documents apart (MLM_PADDING packed and padding_free, train/model/packing.py) through the
real job, on 400 distinct lines of 7 to 17 tokens (tests/data/helpers.py's shards) with a 2-layer, 64-wide
DistilBERT: a run stopped by a real SIGTERM and run again ends with the uninterrupted run's weights, bit for bit (also
streamed, through DataLoader workers); two ranks under a real torchrun (gloo) train on exactly the batches and masks
that one rank does; the batches trained on keep their documents apart; and run.json's packing efficiency is what
those batches were.

The single-rank runs go through the job's main() in this process (tests/e2e/conftest.py's job_in_process,
about a second each); the batches a run trains on are recorded where the collator makes them (:func:`record_batches`,
loaded into torchrun's ranks as their sitecustomize)."""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import run_torchrun, tiny_env
from tests.data.helpers import write_shards
from tests.e2e.runs import OVERRIDES, STEPS, STOP_AT, records
from train.model.collator import MaskingCollator
from train.outputs.runfiles import STREAM_STATE

pytestmark = pytest.mark.slow

APART = ("packed", "padding_free")
BATCH = 8  # per step, whatever the ranks
BLOCK = 32  # max_seq_length: packed blocks of 32 tokens, about 3 documents each


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """400 distinct lines in four gzipped JSON-lines files."""
    directory = tmp_path_factory.mktemp("corpus")
    write_shards(directory, shards=4, per_shard=100)
    return directory


def packing_env(output: Path, corpus: Path, padding: str, **options: str) -> dict[str, str]:
    """A run of STEPS steps of BATCH samples (or blocks) on ``corpus``, no evaluation, no checkpoint but a stop's;
    ``options`` change or add to that."""
    run = dict(
        dataset=str(corpus), padding=padding, max_seq_length=str(BLOCK), config_overrides=OVERRIDES["distilbert"],
        per_device_train_batch_size=str(BATCH), max_steps=str(STEPS), save_strategy="steps", save_steps="100",
        eval_strategy="no", max_eval_samples="16", log_format="json",
    )  # fmt: skip
    return tiny_env(output, **{**run, **options})


def record_batches(directory: str, rank: str) -> None:
    """From now on every training batch the collator makes is saved as ``rank{rank}-{n}.pt`` in ``directory``
    (batch_facts' measuring collates without isolation, and is left out). Self-contained: torchrun's ranks run its
    source as their sitecustomize (:func:`probe_for_ranks`)."""
    import itertools

    import torch

    from train.model.collator import MaskingCollator

    made = MaskingCollator.__call__
    numbers = itertools.count()

    def recording(self: MaskingCollator, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = made(self, features)
        if self.isolate is not None:
            torch.save(batch, f"{directory}/rank{rank}-{next(numbers):03d}.pt")
        return batch

    setattr(MaskingCollator, "__call__", recording)  # noqa: B010 - a class attribute, replaced on purpose


@contextlib.contextmanager
def recording_in_process(directory: Path) -> Iterator[Path]:
    """record_batches for the jobs run in this process meanwhile."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MaskingCollator, "__call__", MaskingCollator.__call__)  # what is restored after
        directory.mkdir()
        record_batches(str(directory), "0")
        yield directory


def probe_for_ranks(env: dict[str, str], directory: Path) -> Path:
    """``env`` made to record every rank's batches into ``directory``: record_batches run by each rank's
    interpreter at startup (a sitecustomize on PYTHONPATH; torchrun's workers have RANK, torchrun itself has not)."""
    site = directory / "site"
    site.mkdir(parents=True)
    start = f"\nif 'RANK' in os.environ:\n    record_batches({str(directory)!r}, os.environ['RANK'])\n"
    source = "from __future__ import annotations\nimport os\nfrom typing import Any\n\n"
    (site / "sitecustomize.py").write_text(source + inspect.getsource(record_batches) + start)
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    return directory


def trained(directory: Path, rank: int = 0, steps: int = STEPS) -> list[dict[str, torch.Tensor]]:
    """The batches rank ``rank`` trained on, in order (the loader collates one ahead: the last is left out)."""
    return [torch.load(directory / f"rank{rank}-{n:03d}.pt", weights_only=True) for n in range(steps)]


def same_weights(first: Path, second: Path) -> None:
    """Two final/ models with the same tensors, bit for bit."""
    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert a.keys() == b.keys()
    differing = [name for name in a if not torch.equal(a[name], b[name])]
    assert not differing, f"{len(differing)} of {len(a)} tensors differ: {differing[:5]}"


def start_steps(output: Path) -> list[int]:
    return [r["start_step"] for r in records(output / "logs" / "train.jsonl") if r["event"] == "banner"]


def facts(output: Path, name: str = "run.json") -> dict[str, Any]:
    return json.loads((output / name).read_text())


def packing_facts(padding: str) -> dict[str, Any]:
    """run.json's packing for a mode that keeps documents apart: no position computed is padding."""
    return {"padding": padding, "documents_apart": True, "efficiency": 1.0}


def stop_and_resume(run: Any, env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> Path:
    """``env``'s run stopped by a real SIGTERM at step STOP_AT (exit 75, its checkpoint saved), then the same run
    again, resuming there and finishing; its output directory."""
    output = Path(env["MLM_OUTPUT_DIR"])
    assert run(env, stop_at=STOP_AT) == 75
    assert facts(output)["status"] == "preempted"
    assert (output / f"checkpoint-{STOP_AT}" / ".complete").exists() and not (output / "final").exists()
    capsys.readouterr()
    assert run(env) == 0
    assert "resuming from" in capsys.readouterr().err
    assert start_steps(output) == [0, STOP_AT]  # resumed at the checkpoint, not trained again from the start
    return output


@pytest.mark.parametrize("padding", APART)
def test_a_preempted_run_resumes_to_the_uninterrupted_runs_weights(
    tmp_path: Path, corpus: Path, job_in_process: Any, capsys: pytest.CaptureFixture[str], padding: str
) -> None:
    """Stopped at step STOP_AT of STEPS and resumed: the same tensors as without the stop. The batches the
    uninterrupted run trained on: every position a document's token, each document attending only to itself."""
    with recording_in_process(tmp_path / "batches") as batches:
        assert job_in_process(packing_env(tmp_path / "straight", corpus, padding)) == 0

    resumed = stop_and_resume(job_in_process, packing_env(tmp_path / "resumed", corpus, padding), capsys)
    same_weights(tmp_path / "straight" / "final", resumed / "final")

    # Efficiency 1.0, and so it was: the Trainer counted every position the model computed as a real token.
    assert facts(tmp_path / "straight")["packing"] == packing_facts(padding)
    rows = trained(batches)
    positions = sum(batch["input_ids"].numel() for batch in rows)
    assert facts(tmp_path / "straight", "all_results.json")["num_input_tokens_seen"] == positions
    assert all(kept_apart(batch) for batch in rows)
    # Positions restart at every document (DistilBERT's start at 0): a row of padding_free holds the step's BATCH
    # examples, a packed block of BLOCK tokens at least two documents (or pieces) of at most 17 tokens.
    restarts = [(batch["position_ids"] == 0).sum(dim=1).tolist() for batch in rows]
    if padding == "packed":
        assert all(tuple(batch["input_ids"].shape) == (BATCH, BLOCK) for batch in rows)
        assert min(min(row) for row in restarts) >= 2, restarts
    else:
        assert all(batch["input_ids"].shape[0] == 1 for batch in rows) and restarts == [[BATCH]] * STEPS


def kept_apart(batch: dict[str, torch.Tensor]) -> bool:
    """Whether a batch's attention is block-diagonal by document, a document beginning where positions restart."""
    document = (batch["position_ids"] == 0).cumsum(dim=1)
    return torch.equal(batch["attention_mask"], (document[:, :, None] == document[:, None, :]).unsqueeze(1))


def one_step_of_two_ranks(halves: list[dict[str, torch.Tensor]], padding: str) -> dict[str, torch.Tensor]:
    """Two ranks' batches of one step as one rank's batch of both: packed blocks stacked; padding_free's rows laid
    end to end, their attention block-diagonal."""
    if padding == "packed":
        return {key: torch.cat([half[key] for half in halves]) for key in halves[0]}
    joined = {key: torch.cat([half[key] for half in halves], dim=1) for key in ("input_ids", "labels", "position_ids")}
    blocks = [half["attention_mask"][0, 0] for half in halves]  # [1, 1, length, length]: one row's
    return {**joined, "attention_mask": torch.block_diag(*blocks)[None, None]}


@pytest.mark.parametrize("padding", APART)
def test_two_ranks_under_torchrun_train_on_one_ranks_batches_and_masks(
    tmp_path: Path, corpus: Path, job_in_process: Any, padding: str
) -> None:
    """A step of BATCH over two ranks is one rank's step of BATCH: each rank half the samples (accelerate deals
    the batches out in turn), each masked by its sample index whichever rank collates it."""
    with recording_in_process(tmp_path / "one") as one:
        assert job_in_process(packing_env(tmp_path / "one-rank", corpus, padding)) == 0

    output = tmp_path / "two-ranks"
    env = packing_env(output, corpus, padding, per_device_train_batch_size=str(BATCH // 2))
    two = probe_for_ranks(env, tmp_path / "two")
    result = run_torchrun(env, nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]

    run = facts(output)
    assert (run["status"], run["world_size"], run["packing"]) == ("finished", 2, packing_facts(padding))
    assert (output / "final" / "model.safetensors").exists()
    for step, (alone, *halves) in enumerate(zip(trained(one), trained(two, 0), trained(two, 1), strict=True)):
        together = one_step_of_two_ranks(halves, padding)
        assert alone.keys() == together.keys()
        differing = [key for key in alone if not torch.equal(alone[key], together[key])]
        assert not differing, f"step {step + 1}: {differing} differ"
    # Both ranks' real tokens, gathered by the Trainer: the one rank's count.
    counted = [facts(o, "all_results.json")["num_input_tokens_seen"] for o in (output, tmp_path / "one-rank")]
    assert counted[0] == counted[1]


def test_a_streamed_packed_corpus_resumes_to_the_uninterrupted_runs_weights(
    tmp_path: Path, corpus: Path, job_in_process: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Packed on the fly, each of two DataLoader workers its two files: the saved stream position (each worker's
    place in its files) resumes at the next block, and the efficiency is measured on the held-out blocks."""
    streamed = {"streaming": "true", "dataloader_num_workers": "2"}
    straight = tmp_path / "straight"
    assert job_in_process(packing_env(straight, corpus, "packed", **streamed)) == 0
    resumed = stop_and_resume(job_in_process, packing_env(tmp_path / "resumed", corpus, "packed", **streamed), capsys)
    saved = json.loads((resumed / f"checkpoint-{STOP_AT}" / STREAM_STATE).read_text())
    assert saved["world_size"] == 1 and saved["ranks"][0]
    same_weights(straight / "final", resumed / "final")
    assert facts(straight)["packing"] == packing_facts("packed")
    # Counted as they went by: full blocks, every position a real token.
    assert facts(straight, "all_results.json")["num_input_tokens_seen"] == STEPS * BATCH * BLOCK
