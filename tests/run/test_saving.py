"""Checkpoints saved in the background (train/run/saving.py): when they may be, the state copied out of the live
tensors, trainer_state.json held back until the weights and optimizer are written, and a checkpoint the same as a
synchronous save's."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import DistilBertConfig, DistilBertForMaskedLM, TrainingArguments

from tests.helpers import trainer_settings
from train.config import CheckpointArguments
from train.model.collator import MaskingCollator
from train.outputs.checkpoints import problem
from train.outputs.runfiles import PENDING_STATE, TRAINER_STATE, RunFiles
from train.run import saving
from train.run.callbacks import CheckpointCompleteMarker
from train.run.saving import CheckpointWriter, StateCopy, background_saves, sync_reason
from train.run.trainer import MLMTrainer

WAIT_S = 30  # a bound against a hang, never reached when the code is right


@pytest.mark.parametrize(
    ("conditions", "words"),
    [
        ({"sharding": "fsdp"}, "sharding fsdp"),
        ({"store": "s3://bucket/run"}, "output_dir is in a store"),
        ({"load_best": True}, "load_best_model_at_end"),
        ({"budgeted": True}, "a time budget"),
        ({}, None),
    ],
)
def test_saves_go_behind_the_loop_unless_a_condition_says_why_not(conditions: dict[str, Any], words: str) -> None:
    given = {"sharding": "ddp", "store": None, "load_best": False, "budgeted": False, **conditions}
    reason = sync_reason(**given)
    assert reason is None if words is None else words in (reason or "")


def test_the_writer_is_made_where_asked_and_allowed_and_a_refusal_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(background_saves(CheckpointArguments(), None), CheckpointWriter)  # the default: on
    assert background_saves(CheckpointArguments(async_save=False), "a time budget's plan") is None
    assert capsys.readouterr().err == ""  # switched off: nothing to say
    assert background_saves(CheckpointArguments(), "sharding fsdp writes each rank's shard") is None
    (line,) = capsys.readouterr().err.splitlines()
    assert "saved synchronously" in line and "sharding fsdp" in line
    monkeypatch.setattr(saving.distributed, "is_world_zero", lambda: False)
    assert background_saves(CheckpointArguments(), "sharding fsdp") is None
    assert capsys.readouterr().err == ""  # rank 0 speaks for all


def test_the_copy_is_the_states_values_held_apart_from_the_live_tensors() -> None:
    weight, moment = torch.arange(6.0).reshape(2, 3), torch.ones(3)
    state = {"state": {0: {"exp_avg": moment, "step": torch.tensor(4.0)}}, "param_groups": [{"lr": 0.1, "params": [0]}]}
    copies = StateCopy()
    taken = copies.take({"weights": {"a": weight}, "optimizer": state}, "root")
    weight.add_(100), moment.zero_()
    state["param_groups"][0]["lr"] = 0.5
    assert torch.equal(taken["weights"]["a"], torch.arange(6.0).reshape(2, 3))
    assert torch.equal(taken["optimizer"]["state"][0]["exp_avg"], torch.ones(3))
    assert taken["optimizer"]["param_groups"] == [{"lr": 0.1, "params": [0]}]  # other values deep-copied
    assert taken["optimizer"]["state"][0]["step"].item() == 4.0


def test_the_buffers_are_kept_from_one_save_to_the_next_and_tied_tensors_share_one() -> None:
    tied = torch.randn(4, 2)
    live = {"embeddings": tied, "decoder": tied.detach(), "bias": torch.zeros(4)}
    copies = StateCopy()
    first = copies.take(live, "weights")
    assert first["embeddings"] is first["decoder"]  # one storage, as save_pretrained finds tied weights
    live["bias"].fill_(7)
    second = copies.take(live, "weights")
    assert second["bias"].data_ptr() == first["bias"].data_ptr()  # the same host memory, no new allocation
    assert torch.equal(second["bias"], torch.full((4,), 7.0))
    live["bias"] = torch.zeros(5)  # another shape: another buffer
    assert copies.take(live, "weights")["bias"].shape == (5,)


def tiny_trainer(output: Path, saves: CheckpointWriter | None, max_steps: int = 2) -> MLMTrainer:
    """A 1-layer DistilBERT saving a checkpoint every step, its marker written by ``saves`` or at once."""
    torch.manual_seed(0)
    config = DistilBertConfig(n_layers=1, dim=32, hidden_dim=64, n_heads=2, vocab_size=50, max_position_embeddings=16)
    collator = MaskingCollator(pad_token_id=0, mask_token_id=4, vocab_size=50, mlm_probability=0.3)
    rows = [{"input_ids": [2, 7, 8, 9, 3], "special_tokens_mask": [1, 0, 0, 0, 1], "sample_index": i} for i in range(8)]
    args = TrainingArguments(
        output_dir=str(output), max_steps=max_steps, save_strategy="steps", save_steps=1, use_cpu=True, report_to=[],
        per_device_train_batch_size=4, dataloader_num_workers=0, logging_strategy="no", disable_tqdm=True, seed=0,
        remove_unused_columns=False,
    )  # fmt: skip
    return MLMTrainer(
        model=DistilBertForMaskedLM(config), args=args, train_dataset=rows, data_collator=collator,
        callbacks=[CheckpointCompleteMarker(RunFiles(output), {"seed": 0}, saves)], settings=trainer_settings(saves=saves),
    )  # fmt: skip


SAME_BYTES = ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", TRAINER_STATE, "config.json")


def test_a_background_save_writes_the_checkpoint_a_synchronous_one_does(tmp_path: Path) -> None:
    tiny_trainer(tmp_path / "sync", None).train()
    tiny_trainer(tmp_path / "async", CheckpointWriter()).train()
    for step in (1, 2):
        sync, background = (RunFiles(tmp_path / kind).checkpoint(step) for kind in ("sync", "async"))
        assert problem(background) is None  # whole, marked, its digests right
        assert not (background / PENDING_STATE).exists()
        for name in SAME_BYTES:
            assert (background / name).read_bytes() == (sync / name).read_bytes(), name
    records = [json.loads(line) for line in RunFiles(tmp_path / "async").train_jsonl.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all(r["save_background_s"] > 0 for r in records)
    synchronous = [json.loads(line) for line in RunFiles(tmp_path / "sync").train_jsonl.read_text().splitlines()]
    assert all(r["save_background_s"] == 0 and r["save_blocking_s"] >= r["save_s"] for r in synchronous)


def test_trainer_state_is_held_back_until_the_weights_and_optimizer_are_written(tmp_path: Path) -> None:
    """A kill while the weights are written leaves a checkpoint a resume sets aside: no trainer_state.json yet."""
    writer = CheckpointWriter()
    trainer = tiny_trainer(tmp_path, writer, max_steps=1)
    trainer.train()
    writing, release = threading.Event(), threading.Event()
    own = trainer.save_weights

    def slow_weights(directory: str | None, state_dict: dict | None) -> None:
        writing.set()
        release.wait(WAIT_S)
        own(directory, state_dict)

    trainer.save_weights = slow_weights  # type: ignore[method-assign]
    trainer.state.global_step = 5
    writer.take(trainer, None)
    saved = RunFiles(tmp_path).checkpoint(5)
    assert (saved / PENDING_STATE).exists() and not (saved / TRAINER_STATE).exists()
    assert writer.start(5, lambda: None, lambda seconds: None)
    assert writing.wait(WAIT_S) and writer.saves.in_flight
    assert problem(saved) == f"no {TRAINER_STATE}: cut off while being written"
    release.set()
    writer.wait()
    assert (saved / TRAINER_STATE).exists() and not (saved / PENDING_STATE).exists()
    assert json.loads((saved / TRAINER_STATE).read_text())["global_step"] == 5
    assert (saved / "optimizer.pt").exists() and (saved / "model.safetensors").exists()


def test_a_save_nobody_handed_over_is_marked_synchronously(tmp_path: Path) -> None:
    """start() answers False for a step it holds nothing of (another rank, or a synchronous save): the caller marks."""
    assert CheckpointWriter().start(3, lambda: None, lambda seconds: None) is False
