"""Checkpoints saved in the background (``MLM_ASYNC_SAVE``, on by default): the training loop waits only while the
model's, optimizer's and scheduler's state is copied to CPU memory (pinned, from a GPU); a thread
(train/outputs/background.py) writes it, digests the files, writes the ``.complete`` marker and then rotates the
older checkpoints away.

How a save goes, in the Trainer's order (its ``_save_checkpoint``: train/borrowed/transformers_trainer.py
``save_checkpoint_in_parts``):

1. every rank, on the training thread (:meth:`CheckpointWriter.take`): wait for the save in flight (one at most; its
   failure is raised here), copy the state out into buffers kept from one save to the next, write this rank's RNG
   state; rank 0 writes ``trainer_state.json`` as ``trainer_state.json.pending``;
2. every rank, in ``on_save`` (train/run/callbacks.py CheckpointCompleteMarker): the ranks' own files digested and
   gathered to rank 0 - the collectives stay on the training thread - and rank 0 hands the rest to the thread
   (:meth:`CheckpointWriter.start`);
3. behind the loop: the weights (with the config, tokenizer and arguments), the optimizer, scheduler and scaler
   written, then ``trainer_state.json.pending`` renamed ``trainer_state.json``, the marker, the rotation.

A kill at any point leaves a checkpoint without trainer_state.json until the weights and optimizer are whole, which
a resume sets aside (train/outputs/checkpoints.py). The end of training, a stop's save during an evaluation and the
job's exit wait for the save in flight.

Saves stay synchronous, said once, where the background would be wrong or unmeasured: under FSDP (its checkpoints
are written by every rank through torch.distributed.checkpoint), with an output_dir in a store (the upload follows
the marker), with load_best_model_at_end (the Trainer reads the best checkpoint back as it trains) and under a time
budget (its plan counts a save's whole time).
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from train.borrowed.transformers_trainer import OPTIMIZER_NAME, SCALER_NAME, SCHEDULER_NAME, save_checkpoint_in_parts
from train.common import distributed
from train.common.console import say, warn
from train.config import CheckpointArguments
from train.outputs.background import BackgroundSave, BackgroundSaves
from train.outputs.runfiles import PENDING_STATE, TRAINER_STATE


def sync_reason(sharding: str, store: str | None, load_best: bool, budgeted: bool) -> str | None:
    """Why checkpoints must be saved synchronously in this run, in words; None when they can go behind the loop.
    ``sharding``: the mode decided; ``store``: the output_dir's store, if any; ``load_best``:
    load_best_model_at_end; ``budgeted``: a time budget's deadline was handed over."""
    if sharding == "fsdp":
        return "sharding fsdp writes each rank's shard through torch.distributed.checkpoint"
    if store is not None:
        return "output_dir is in a store, uploaded once the marker is written"
    if load_best:
        return "load_best_model_at_end reads the best checkpoint back while training"
    if budgeted:
        return "a time budget's plan counts a save's whole time"
    return None


def background_saves(checkpoint: CheckpointArguments, reason: str | None) -> CheckpointWriter | None:
    """The writer of this run's background saves, or None for synchronous ones: async_save off, or on where
    ``reason`` (:func:`sync_reason`) says it cannot be, which world rank 0 says in one line."""
    if not checkpoint.async_save:
        return None
    if reason is not None:
        if distributed.is_world_zero():
            say(f"checkpoints are saved synchronously, not in the background: {reason}")
        return None
    return CheckpointWriter()


class StateCopy:
    """CPU copies of a state (a tensor, or dicts, lists and tuples of them, as state dicts are), into buffers kept
    from one save to the next: the same path gets the same buffer while its shape and type stay. Pinned memory for a
    GPU's tensors, copied without blocking and synchronised once. Tensors sharing their memory (tied weights) share
    one copy, as save_pretrained expects to find them."""

    def __init__(self) -> None:
        self.buffers: dict[tuple[Any, ...], torch.Tensor] = {}

    def take(self, state: Any, root: str) -> Any:
        """A copy of ``state``: tensors into the buffers under ``root``, other values deep-copied."""
        shared: dict[tuple[Any, ...], torch.Tensor] = {}
        taken = self._copy(state, (root,), shared)
        if any(key[-1] == "cuda" for key in shared):
            torch.cuda.synchronize()
        return taken

    def _copy(self, value: Any, path: tuple[Any, ...], shared: dict[tuple[Any, ...], torch.Tensor]) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value.detach(), path, shared)
        if isinstance(value, dict):
            return {key: self._copy(item, (*path, key), shared) for key, item in value.items()}
        if type(value) in (list, tuple):
            return type(value)(self._copy(item, (*path, i), shared) for i, item in enumerate(value))
        return copy.deepcopy(value)

    def _tensor(self, tensor: torch.Tensor, path: tuple[Any, ...], shared: dict[tuple[Any, ...], torch.Tensor]) -> Any:
        same = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, tensor.device.type)
        if tensor.numel() and same in shared:
            return shared[same]
        buffer = self.buffers.get(path)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=tensor.is_cuda)
            self.buffers[path] = buffer
        buffer.copy_(tensor, non_blocking=tensor.is_cuda)
        shared[same] = buffer
        return buffer


@dataclass(frozen=True)
class Taken:
    """One checkpoint's state as copied out, rank 0's, and what is left to do for it."""

    step: int
    directory: Path
    state: dict[str, Any]  # "weights", and unless save_only_model "optimizer", "scheduler", maybe "scaler"
    save_weights: Callable[[str, dict], None]  # the Trainer's hook: the weights, config, tokenizer and arguments
    rotate: Callable[[], None]  # the older checkpoints rotated away (the Trainer's rule), once this one is complete


class CheckpointWriter(TrainerCallback):
    """A Trainer's checkpoints saved behind its loop (the module's docstring says how). The Trainer's save hook calls
    :meth:`take`, the completeness marker's ``on_save`` calls :meth:`start`; the end of training waits here."""

    def __init__(self) -> None:
        self.saves = BackgroundSaves()
        self.copies = StateCopy()
        self.pending: Taken | None = None

    def take(self, trainer: Any, trial: Any) -> None:
        """The training thread's part of a save (every rank, where the Trainer saves): the state copied out, the RNG
        state and (rank 0) the held-back trainer state written."""
        self.saves.wait()
        state: dict[str, Any] = {}
        where: list[Path] = []

        def take_out(directory: str) -> None:
            if trainer.args.should_save:
                state.update(taken_state(trainer, self.copies))
                where.append(Path(directory))

        rotate = save_checkpoint_in_parts(trainer, trial, take_out, PENDING_STATE)
        step = trainer.state.global_step
        self.pending = Taken(step, where[0], state, trainer.save_weights, rotate) if where else None

    def start(self, step: int, mark: Callable[[], None], done: Callable[[float], None]) -> bool:
        """Rank 0, once the ranks' digests are gathered: the pending save of ``step`` written behind the loop, then
        ``mark`` (its marker), its rotation and ``done`` (told the seconds it took). False when none is pending: the
        save was synchronous, and the caller marks it."""
        taken, self.pending = self.pending, None
        if taken is None or taken.step != step:
            return False
        write = functools.partial(write_taken, taken)
        self.saves.start(BackgroundSave(step, write, mark, taken.rotate, done))
        return True

    def wait(self) -> None:
        """Once the save in flight is written; raises what its write raised (a full disk's OSError)."""
        self.saves.wait()

    def rewind(self, step: int) -> None:
        """After a rollback to ``step``: the next save is in order after it (train/outputs/background.py)."""
        self.pending = None
        self.saves.rewind(step)

    def close(self) -> None:
        """At the job's exit on a failure: the save in flight is finished; its own failure said, not raised (the
        job's is the one that ends it)."""
        try:
            self.saves.wait()
        except Exception as exc:  # noqa: BLE001 - said: the exit's own exception is on its way out
            warn(f"the checkpoint written in the background failed too: {type(exc).__name__}: {exc}")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.wait()


def taken_state(trainer: Any, copies: StateCopy) -> dict[str, Any]:
    """What rank 0 writes of a checkpoint, copied out of the live tensors: the weights of the model as the Trainer
    saves it (unwrapped, compiled or not), and unless save_only_model the optimizer's, scheduler's and scaler's."""
    model = trainer.accelerator.unwrap_model(trainer.model, keep_torch_compile=False)
    state = {"weights": copies.take(model.state_dict(), "weights")}
    if trainer.args.save_only_model:
        return state
    state["optimizer"] = copies.take(trainer.optimizer.state_dict(), "optimizer")
    state["scheduler"] = copies.take(trainer.lr_scheduler.state_dict(), "scheduler")
    scaler = getattr(trainer.accelerator, "scaler", None)
    if scaler is not None:
        state["scaler"] = copies.take(scaler.state_dict(), "scaler")
    return state


def write_taken(taken: Taken) -> None:
    """Behind the loop: a checkpoint's files from its copied state, as the Trainer writes them (the weights through
    its ``save_weights`` hook: the config, tokenizer and arguments with them), then trainer_state.json released."""
    directory = taken.directory
    taken.save_weights(str(directory), dict(taken.state["weights"]))  # save_pretrained pops what it writes
    for key, name in (("optimizer", OPTIMIZER_NAME), ("scheduler", SCHEDULER_NAME), ("scaler", SCALER_NAME)):
        if key in taken.state:
            torch.save(taken.state[key], directory / name)
    os.replace(directory / PENDING_STATE, directory / TRAINER_STATE)
