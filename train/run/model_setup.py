"""Each rank's model, ready to be handed to the Trainer: built (or loaded), its masked-only head and freezing applied,
its sharding mode decided, and under fsdp sharded, with no rank but rank 0 ever holding the whole model.

The rule (MLM_SHARDING=fsdp or auto, more than one rank):

1. Rank 0 builds or loads the model as a DDP run does, applies the head and the freezing (their probe forwards run
   here, on real weights), and decides the mode with DDP's estimate for it (train/model/memory.py).
2. It sends the other ranks what they need: the mode and why, the estimate, the model's config, whether the head
   held, the names frozen, what the pretrained weights lacked, and each tensor's name, shape and type. A ConfigError
   on rank 0 (a model it cannot load, fsdp refusing an option) is raised on every rank with its words.
3. Under fsdp the other ranks build the same architecture on the meta device (no memory), apply the head without
   its probe and freeze the names rank 0 sent; under ddp they build or load their own copy, as before.
4. :func:`shard_for_training`: every rank shards (train/run/sharding.py); the meta ranks take storage for their
   shards only (``to_empty``), and rank 0's weights reach each rank's shard from rank 0, one tensor at a time
   (torch.distributed.checkpoint's ``set_model_state_dict(broadcast_from_rank0=True)``), then its buffers, which no
   state dict carries when they are not persistent (DistilBERT's ``position_ids``). Ties survive: ``to_empty`` keeps
   each parameter object, so the decoder tied to the embeddings is still one parameter.

Each rank's growth in resident memory while its model is set up is measured (``setup_bytes``, run.json); under fsdp
the other ranks' is about their shard, rank 0's the whole model. The same rule as accelerate's FSDP2 preparation
with ``cpu_ram_efficient_loading`` (accelerate/utils/fsdp_utils.py), which the job cannot use: accelerate does not
shard CPU ranks (train/run/sharding.py). A model from ``trust_remote_code`` is built by every rank itself: its config
class lives in a module the other ranks have not imported.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from transformers import AutoModelForMaskedLM, TrainingArguments

from train.borrowed.transformers_models import attn_implementation
from train.common import distributed
from train.common.console import first_few, warn
from train.common.errors import ConfigError
from train.common.handoff import Handoff
from train.config import AdaptingArguments, DataArguments, LaunchArguments, ModelArguments
from train.model.head import freeze, freeze_what_the_loss_never_reaches, use_masked_only_head
from train.model.load import check_positions, load_model
from train.model.memory import choose_sharding, ddp_estimate
from train.run.adapting import freeze_layers
from train.run.sharding import check_sharding, reset_peak_memory, resident_bytes, resumed_mode, shard_model

# What rank 0 decided about the model that every rank takes as its own (RankModel's fields of the same names).
_FACTS = ("head", "head_weights", "sharding", "choice", "estimate")


@dataclass
class RankModel:
    """This rank's model and what was decided about it (the same on every rank)."""

    model: Any
    head: str  # "masked-only" (train/model/head.py) or "dense"
    head_weights: str | None  # what the pretrained weights lacked of the head (train/model/weights.py), or None
    sharding: str  # ddp or fsdp
    choice: str  # the mode and why, with DDP's estimate
    estimate: dict[str, int]  # DDP's memory estimate for the model (train/model/memory.py)
    on_meta: bool = False  # built without storage: rank 0's weights arrive when it is sharded
    setup_bytes: int | None = None  # this rank's growth in resident memory while the model was set up


@dataclass(frozen=True)
class Blueprint:
    """What every rank builds its model from beside the options, found before the model (train/run/build.py)."""

    arch: Any | None  # the architecture trained from scratch (train/model/load.py scratch_config), or None
    tokenizer: Any
    model_config: Any | None  # a pretrained model's config, checked before the data (check_before_data), or None
    resume: Path | None  # the checkpoint this rank resumes from: a mode it was written in is kept


def set_up_model(
    model: ModelArguments,
    data: DataArguments,
    adapting: AdaptingArguments,
    launch: LaunchArguments,
    training: TrainingArguments,
    blueprint: Blueprint,
) -> RankModel:
    """This rank's model, unsharded (:func:`shard_for_training` shards it once the collator and the budget have seen
    it): the module docstring's rule when it may be sharded, else every rank builds its own and decides alike."""
    with _growth() as measured:
        if not _rank_zero_first(launch, model):
            built = _built_here(model, data, adapting, launch, training, blueprint)
        else:
            built = _from_rank_zero(model, data, adapting, launch, training, blueprint)
    built.setup_bytes = measured[0]
    return built


def shard_for_training(built: RankModel, training: TrainingArguments) -> Any:
    """The model to train: under fsdp sharded, each rank's shard holding rank 0's weights (the module docstring's
    step 4); under ddp as it was built. The growth in resident memory counts on from :func:`set_up_model`."""
    if built.sharding != "fsdp":
        return built.model
    with _growth() as measured:
        model = built.model
        full = model.state_dict() if distributed.is_world_zero() else {}  # the tensors themselves, not copies
        sharded = shard_model(model, training.device.type, bool(training.bf16))
        if distributed.several_ranks():
            if built.on_meta:
                sharded.to_empty(device=training.device)
            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
            set_model_state_dict(sharded, full, options=options)  # strict=False: a tied decoder is the embeddings'
            del full
            for buffer in sharded.buffers():
                dist.broadcast(buffer, src=0)
    if measured[0] is not None:  # the kernel said (Linux's /proc): what the shards added to the set-up
        built.setup_bytes = (built.setup_bytes or 0) + measured[0]
    return sharded


def _rank_zero_first(launch: LaunchArguments, model: ModelArguments) -> bool:
    """Whether rank 0 builds first and the others may build on meta: more than one rank, a mode that may be fsdp,
    and a config class every rank can unpickle."""
    return distributed.several_ranks() and launch.sharding in ("fsdp", "auto") and not model.trust_remote_code


def _built_here(
    model: ModelArguments,
    data: DataArguments,
    adapting: AdaptingArguments,
    launch: LaunchArguments,
    training: TrainingArguments,
    blueprint: Blueprint,
) -> RankModel:
    """Rank 0's build (and every rank's when :func:`_rank_zero_first` is false): loaded, the head probed and
    applied, what the loss never reaches frozen, the mode decided."""
    module, head_weights = load_model(model, data, blueprint.arch, blueprint.tokenizer, blueprint.model_config)
    head = with_head(model, module)
    unreached = freeze_what_the_loss_never_reaches(module)
    _say_frozen(unreached)
    freeze_layers(adapting, module)  # before DDP wraps it: DDP leaves out what does not train
    mode, choice, estimate = decide_sharding(module, blueprint.resume, launch, training, adapting, data.max_seq_length)
    return RankModel(module, head, head_weights, mode, choice, estimate)


def with_head(model: ModelArguments, module: Any, doing: str = "training") -> str:
    """The masked-only head when it is asked for and this model (``module``) takes it (an explicit ask that cannot be
    kept is a ConfigError; the default falls back to the dense head with a warning): "masked-only" or "dense".
    Training and evaluate alike (``doing`` says which, in the warning)."""
    if not model.masked_only_head:
        return "dense"
    try:
        use_masked_only_head(module)
    except ConfigError as exc:
        if "masked_only_head" in model.sources:  # asked for explicitly: say it cannot be done
            raise
        warn(f"{exc}; {doing} with the dense head")
        return "dense"
    return "masked-only"


def _say_frozen(unreached: list[str]) -> None:
    if unreached:
        shown = first_few(unreached)
        warn(f"{len(unreached)} parameter(s) take no part in the masked-LM loss and stay as they are: {shown}")


def _from_rank_zero(
    model: ModelArguments,
    data: DataArguments,
    adapting: AdaptingArguments,
    launch: LaunchArguments,
    training: TrainingArguments,
    blueprint: Blueprint,
) -> RankModel:
    """The module docstring's steps 1-3."""
    sent: list[Any] = [None]
    if distributed.is_world_zero():
        try:
            built = _built_here(model, data, adapting, launch, training, blueprint)
        except ConfigError as exc:
            sent[0] = {"error": str(exc)}
            dist.broadcast_object_list(sent, src=0)
            raise
        frozen = [n for n, p in built.model.named_parameters() if not p.requires_grad]
        facts = {name: getattr(built, name) for name in _FACTS}
        sent[0] = {**facts, "config": built.model.config, "frozen": frozen, "tensors": _tensors(built.model)}
        dist.broadcast_object_list(sent, src=0)
        return built
    dist.broadcast_object_list(sent, src=0)
    received = sent[0]
    if "error" in received:
        raise ConfigError(received["error"])
    facts = {name: received[name] for name in _FACTS}
    if received["sharding"] != "fsdp":  # every rank keeps its own replica: built as a DDP run builds it
        built = _built_here(model, data, adapting, launch, training, blueprint)
        return dataclasses.replace(built, **facts)  # rank 0's words: the same decision
    module = _on_meta(received["config"])
    check_positions(data, module.config)
    if received["head"] == "masked-only":
        use_masked_only_head(module, probe=False)  # rank 0 probed the same architecture
    freeze(module, received["frozen"])
    _say_frozen(received["frozen"])
    if _tensors(module) != received["tensors"]:
        raise RuntimeError("the model built on the meta device differs from rank 0's: " + _difference(module, received))
    return RankModel(module, on_meta=True, **facts)


def _on_meta(model_config: Any) -> Any:
    """The architecture of rank 0's model without storage: its config says the dtype and attention it was loaded
    with (from_config keeps both)."""
    with torch.device("meta"):
        return AutoModelForMaskedLM.from_config(model_config, attn_implementation=attn_implementation(model_config))


def _tensors(model: Any) -> list[tuple[str, tuple[int, ...], str, bool]]:
    """Each parameter's and buffer's name, shape, type and whether it trains, ties included: what must agree for
    the shards to fit together."""
    parameters = [(n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in model.named_parameters()]
    buffers = [(n, tuple(b.shape), str(b.dtype), False) for n, b in model.named_buffers()]
    return parameters + buffers


def _difference(model: Any, received: dict[str, Any]) -> str:
    mine, theirs = _tensors(model), received["tensors"]
    for here, there in zip(mine, theirs, strict=False):
        if here != there:
            return f"{here} here, {there} on rank 0"
    return f"{len(mine)} tensors here, {len(theirs)} on rank 0"


def decide_sharding(
    model: Any,
    resume: Path | None,
    launch: LaunchArguments,
    training: TrainingArguments,
    adapting: AdaptingArguments,
    max_seq_length: int,
) -> tuple[str, str, dict[str, int]]:
    """The mode this run trains with (MLM_SHARDING; ``auto`` from DDP's estimate for the built ``model`` against the
    smallest GPU the launcher handed over, or a resumed checkpoint's own mode), checked for what fsdp refuses, the
    words that say why, and DDP's estimate."""
    handoff = Handoff.from_environ()
    gpu_memory = handoff.gpu_memory_bytes if handoff is not None else None
    estimate = ddp_estimate(model, training, max_seq_length)
    requested = launch.sharding
    mode, words = choose_sharding(requested, estimate, gpu_memory, training.world_size, resumed_mode(launch, resume))
    if requested == "auto":
        check_sharding(launch, training, adapting, mode)
    return mode, words, estimate


@contextlib.contextmanager
def _growth() -> Iterator[list[int | None]]:
    """This process's growth in resident memory over the block: its peak during it less its size before (None
    where the kernel does not say); the peak is restarted first (train/run/sharding.py)."""
    measured: list[int | None] = [None]
    reset_peak_memory("cpu")
    before = resident_bytes()
    yield measured
    after = resident_bytes("VmHWM")
    if before is not None and after is not None:
        measured[0] = max(after - before, 0)
