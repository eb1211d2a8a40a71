"""FSDP2 (``fully_shard``) under the Trainer: each rank keeps a shard of the weights, gradients and AdamW state
instead of a whole replica (MLM_SHARDING=fsdp), the same code path on CPU (gloo) and GPU (nccl).

What the libraries lack (transformers 5.25, accelerate 1.16, torch 2.15): accelerate turns FSDP on only for
accelerator distributed types (``accelerate/state.py``: MULTI_CPU is left out), so the Trainer's ``fsdp`` options
silently train DDP on CPU ranks, and transformers' load-time sharding refuses to resume. So the job shards the model
itself, as torchtitan does, and hands the Trainer a model it does not wrap again (:class:`ShardedTrainer`).

A checkpoint keeps the weights and the optimizer as each rank's shard through torch.distributed.checkpoint
(``model_dcp/``, ``optimizer_dcp/``): no rank gathers the whole state to save it. They are read back without
unpickling (train/common/safe_dcp.py). A resume on the world size that wrote them is bit-identical; on another world
size (one rank included: fsdp on a mesh of one shards nothing but runs the same code, so a sharded checkpoint
resumes there) DCP reshards both at load, and the run goes on as the uninterrupted one did
(tests/e2e/test_sharding.py). ``final/`` alone is consolidated: full safetensors that AutoModelForMaskedLM loads.
"""

from __future__ import annotations

import contextlib
import os
import resource
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from transformers import TrainerCallback, TrainingArguments
from transformers.modeling_layers import GradientCheckpointingLayer

from train.borrowed.accelerate import give_no_sync, leave_unwrapped
from train.borrowed.transformers_trainer import OPTIMIZER_NAME, SCHEDULER_NAME
from train.common import distributed
from train.common.errors import ConfigError
from train.common.safe_dcp import SafeFileSystemReader, SafeFileSystemWriter, SafeLoadPlanner
from train.config import AdaptingArguments, LaunchArguments
from train.config.model_source import SHARDED_WEIGHTS
from train.run.adapting import adapting_options
from train.run.trainer import MLMTrainer

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # gathered on rank 0, plain CPU tensors
OPTIMIZER_DIR = "optimizer_dcp"  # in a checkpoint: .metadata, .metadata.pt and each rank's __<rank>_0.distcp
MODEL_DIR = SHARDED_WEIGHTS  # the same for the weights: an fsdp checkpoint's only copy of them


def check_sharding(
    launch: LaunchArguments, training: TrainingArguments, adapting: AdaptingArguments, mode: str | None = None
) -> None:
    """ConfigError, naming MLM_SHARDING, for what fsdp cannot run with (yet): before any data is read when it is set,
    once the model is built when ``auto`` chose it (``mode``)."""
    if (mode or launch.sharding) != "fsdp":
        if training.fsdp:  # accelerate gives CPU ranks DDP under it without a word; GPU ranks another FSDP than ours
            raise ConfigError(
                # every section knows where each option was set, the Trainer's own fsdp too
                f"{launch.source_of('fsdp')}: the Trainer's own FSDP is not used by this job; "
                "set MLM_SHARDING=fsdp to shard the model (and leave fsdp/fsdp_config unset)"
            )
        return
    option = f"{launch.source_of('sharding')}={launch.sharding}"
    if training.fp16:
        # accelerate's GradScaler would look for inf/NaN in each rank's shard alone and the ranks could disagree
        raise ConfigError(f"{option}: fp16 is not supported under fsdp; use bf16 or fp32")
    if training.fsdp:
        # the Trainer's own FSDP goes through accelerate, which gives CPU ranks DDP without a word
        raise ConfigError(f"{option}: leave the Trainer's fsdp/fsdp_config unset; MLM_SHARDING shards the model")
    if training.load_best_model_at_end:
        raise ConfigError(f"{option}: load_best_model_at_end is not supported under fsdp yet")
    for name in adapting_options(adapting):  # frozen parameters and a head's own group are untried on shards
        raise ConfigError(f"{option}: {adapting.source_of(name)} is not supported under fsdp yet; use ddp")


def written_in(checkpoint: Path) -> str | None:
    """The mode ``checkpoint`` was written in, from its optimizer's files; None when it holds no optimizer."""
    if (checkpoint / OPTIMIZER_DIR).is_dir():
        return "fsdp"
    return "ddp" if (checkpoint / OPTIMIZER_NAME).exists() else None


def resumed_mode(launch: LaunchArguments, checkpoint: Path | None) -> str | None:
    """The mode a resume of ``checkpoint`` must train in (its own), or None when any will do; ConfigError naming
    MLM_SHARDING when it is set to the other one: a ddp checkpoint holds no sharded optimizer, an fsdp one no
    optimizer.pt (the Trainer would go on without its optimizer state, silently)."""
    written = written_in(checkpoint) if checkpoint is not None else None
    requested = launch.sharding
    if written is None or requested in ("auto", written):
        return written
    assert checkpoint is not None
    raise ConfigError(
        f"{launch.source_of('sharding')}={requested}: {checkpoint.name} was written under {written}; resume it with "
        f"MLM_SHARDING={written} (or auto), or start over with MLM_RESUME=never"
    )


def shard_model(model: torch.nn.Module, device_type: str, bf16: bool = False) -> torch.nn.Module:
    """``fully_shard`` each transformer layer, then the root: the embeddings stay in the root's unit with the MLM
    decoder tied to them (a tie split across units would be two parameters). Layers are found as transformers'
    ``GradientCheckpointingLayer``, not ``_no_split_modules``: DistilBERT, ELECTRA, DeBERTa-v2 and ALBERT have none,
    and where it exists it names the embeddings too. The head and freezing must be applied before: their probe
    forwards would otherwise be collectives.

    bf16 (the launcher's precision on a GPU that has it) is FSDP2's mixed precision: computed in bf16, gradients
    reduced in fp32, the sharded weights and AdamW state kept in fp32. accelerate's own autocast never applies here,
    since it wraps the model in ``prepare``, which a sharded model skips (:class:`ShardedTrainer`). Not yet measured
    on a GPU."""
    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ConfigError(f"MLM_SHARDING=fsdp: {type(model).__name__} has no transformer layer to shard")
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    options: dict[str, Any] = {"mesh": mesh, **({"mp_policy": policy} if policy is not None else {})}
    for layer in layers:
        fully_shard(layer, **options)
    fully_shard(model, **options)
    return model


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class ShardedTrainer(MLMTrainer):
    """The job's Trainer for a model already sharded by :func:`shard_model` (transformers 5.25, accelerate 1.16).

    * ``accelerator.prepare`` returns such a model as it is (train/borrowed/accelerate.py ``leave_unwrapped``);
      without it CPU ranks wrap the DTensor model in DDP, which fails, and GPU ranks raise.
    * ``no_sync``: the Trainer's gradient accumulation asks the model for it (train/borrowed/accelerate.py
      ``give_no_sync``): FSDP2 then skips the reduce-scatter of all but the last micro-batch.
    * ``create_optimizer`` reshards first: an evaluation leaves the root unit's parameters unsharded.
    * ``save_checkpoint_model``: a checkpoint's weights as each rank's shard through torch.distributed.checkpoint
      (the Trainer calls ``save_model`` on every rank there); final/'s with save_pretrained (``save_weights``),
      from the full weights every rank gathered (:meth:`gather_for_save`, a collective): save_pretrained cannot
      save DTensors ("invalid python storage").
    * the optimizer: each rank's shard through torch.distributed.checkpoint (the Trainer torch.save-s rank 0's
      shard as if it were the whole state), loaded with the pickle-free reader.
    * ``load_from_checkpoint``: each rank's shard of the weights through torch.distributed.checkpoint (the
      Trainer's ``load_state_dict`` fails: "aten.copy_.default got mixed torch.Tensor and DTensor").

    The Trainer's private methods these replace are overridden in train/borrowed/transformers_trainer.py
    (``TrainerOverrides``), which calls the public-named hooks implemented here.
    """

    def __init__(self, model: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        if not isinstance(model, FSDPModule):
            raise TypeError("ShardedTrainer takes a model sharded by shard_model")
        leave_unwrapped(model)
        give_no_sync(model)
        self._gathered: dict[str, torch.Tensor] | None = None
        super().__init__(model, *args, **kwargs)

    def create_optimizer(self, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
        for module in (model or self.model).modules():
            if isinstance(module, FSDPModule):
                module.reshard()
        return super().create_optimizer(model)

    def gather_for_save(self) -> None:
        """Every rank: gather the full weights onto rank 0 for the next ``save_model`` (which only rank 0 calls).
        The gathered copies are separate tensors: tied names are pointed back at one, so that save_pretrained,
        which finds ties by storage, stores the tied weight once as for an unsharded model."""
        full = get_model_state_dict(self.model, options=FULL)
        owners: dict[int, list[str]] = {}
        for name, parameter in self.model.named_parameters(remove_duplicate=False):
            owners.setdefault(id(parameter), []).append(name)
        for names in owners.values():
            for other in names[1:]:
                if names[0] in full:
                    full[other] = full[names[0]]
        self._gathered = full

    def save_checkpoint_model(self, output_dir: str | None) -> None:
        """A checkpoint (every rank is here): each rank writes its shard of the weights, and rank 0 the config,
        tokenizer and arguments beside them. (final/, once ``gather_for_save`` ran on every rank, is the
        consolidated model: :meth:`save_weights`.)"""
        directory = Path(output_dir or self.args.output_dir)
        state = {"model": get_model_state_dict(self.model)}
        dcp.save(state, storage_writer=SafeFileSystemWriter(directory / MODEL_DIR))
        self.trainer_save(str(directory), state_dict={})  # the config, tokenizer and arguments (rank 0 writes them)

    def _inner_optimizer(self) -> torch.optim.Optimizer:
        return getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate's AcceleratedOptimizer wraps it

    def save_optimizer_and_scheduler(self, output_dir: str) -> None:
        state = {"optimizer": get_optimizer_state_dict(self.model, self._inner_optimizer())}
        dcp.save(state, storage_writer=SafeFileSystemWriter(Path(output_dir) / OPTIMIZER_DIR))
        if self.args.should_save:
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))

    def load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint is None:
            return
        optimizer = self._inner_optimizer()
        state = {"optimizer": get_optimizer_state_dict(self.model, optimizer)}
        reader = SafeFileSystemReader(Path(checkpoint) / OPTIMIZER_DIR)
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner())
        set_optimizer_state_dict(self.model, optimizer, state["optimizer"])
        scheduler = torch.load(os.path.join(checkpoint, SCHEDULER_NAME), weights_only=True)
        self.lr_scheduler.load_state_dict(scheduler)

    def load_from_checkpoint(self, resume_from_checkpoint: str, model: torch.nn.Module | None = None) -> None:
        model = model or self.model
        # each rank reads its shard, resharded when the checkpoint had another world size
        sharded = Path(resume_from_checkpoint) / MODEL_DIR
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, storage_reader=SafeFileSystemReader(sharded), planner=SafeLoadPlanner())
        set_model_state_dict(model, state["model"])

    def save_weights(self, output_dir: str | None, state_dict: dict | None) -> None:
        if self._gathered is None:
            raise RuntimeError("ShardedTrainer: gather_for_save must run on every rank before a save")
        gathered, self._gathered = self._gathered, None
        super().save_weights(output_dir, dict(gathered))  # a copy: save_pretrained empties the dict it gets


class StateBytes(TrainerCallback):
    """This rank's bytes of parameters, gradients and optimizer state, measured once, at the first optimizer step
    (when all three exist: the Trainer drops the gradients after it): the sum of the local tensors, so a shard
    counts its own size. And its peak memory while training: from the start of training to its end, the final
    model's consolidation after it left out (on a GPU that happens in CPU memory)."""

    def __init__(self) -> None:
        self.measured: dict[str, int] | None = None
        self.training_peak: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        reset_peak_memory(args.device.type)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.training_peak = peak_memory_bytes(args.device.type)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model, optimizer = kwargs.get("model"), kwargs.get("optimizer")
        if self.measured is not None or model is None or optimizer is None:
            return
        parameters = [p for p in model.parameters()]
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it
        moments = [t for s in inner.state.values() for t in s.values() if isinstance(t, torch.Tensor) and t.dim()]
        self.measured = {
            "parameters": sum(_bytes(p) for p in parameters),
            "gradients": sum(_bytes(p.grad) for p in parameters if p.grad is not None),
            "optimizer": sum(_bytes(t) for t in moments),
        }


def _bytes(tensor: torch.Tensor) -> int:
    local = _local(tensor)
    return local.numel() * local.element_size()


def sharding_facts(mode: str, measured: StateBytes, setup_bytes: int | None = None) -> dict[str, Any]:
    """run.json's ``sharding``: the mode, each rank's measured bytes of training state, its peak memory while
    training and its growth in resident memory while its model was set up (train/run/model_setup.py); a
    collective: every rank calls it."""
    ranks = distributed.gather_from_every_rank((measured.measured or {}, measured.training_peak, setup_bytes))
    totals = [sum(state.values()) for state, _, _ in ranks]
    return {
        "mode": mode,
        "state_bytes_per_rank": [state for state, _, _ in ranks],
        "state_bytes_total": sum(totals),
        "training_peak_bytes_per_rank": [peak for _, peak, _ in ranks],
        "setup_bytes_per_rank": [setup for _, _, setup in ranks],
    }


def reset_peak_memory(device_type: str) -> None:
    """Start this rank's peak memory afresh: the CUDA allocator's statistics, or the kernel's high-water mark of
    the resident set (``/proc/self/clear_refs``, Linux 4.0+; where it cannot be written the peak counts from the
    process's start)."""
    if device_type == "cuda" and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        return
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_memory_bytes(device_type: str) -> int:
    """This rank's peak memory since :func:`reset_peak_memory`: what the CUDA allocator held at most on a GPU; the
    resident set's high-water mark on CPU (the interpreter and libraries included, about the same for every mode)."""
    if device_type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    peak = resident_bytes("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def resident_bytes(field: str = "VmRSS") -> int | None:
    """This process's resident set in host memory now (``VmRSS``) or its high-water mark since
    :func:`reset_peak_memory` (``VmHWM``), from /proc/self/status; None where the kernel does not say."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024  # kB
    return None
