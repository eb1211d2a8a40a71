"""What a model's training takes of each rank's memory under DDP, estimated before it trains, and the rule that
picks the sharding from it (MLM_SHARDING=auto). The ranks estimate from the model they built; ``plan`` from the
same model built on the meta device (no memory), so both show one figure made one way.
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForMaskedLM, TrainingArguments
from transformers.modeling_layers import GradientCheckpointingLayer

from train.config import ModelArguments
from train.model.load import scratch_config

# A replica's training state per parameter: fp32 weights (4), gradients (4) and AdamW's two moments (8). bf16 under
# DDP (accelerate's autocast) keeps the same fp32 state, so the figure holds for both precisions.
STATE_BYTES_PER_PARAMETER = 16
# Activations kept for the backward pass per token and hidden unit of each layer, in bytes of 16-bit values
# (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", eq. 1, without the
# attention scores that SDPA and flash attention never hold); fp32 holds twice as many bytes.
ACTIVATION_VALUES_PER_UNIT = 34
# The share of a GPU the estimate may fill: the CUDA context, the allocator's fragmentation and the evaluation
# batch need the rest.
USABLE_SHARE = 0.85


def ddp_estimate(model: torch.nn.Module, training: TrainingArguments, max_seq_length: int) -> dict[str, int]:
    """DDP's memory per rank for ``model`` at this run's batch (``training``'s per-device batch and precision, of
    ``max_seq_length`` tokens): the training state (every parameter's weights, gradient and AdamW state) and the
    activations of one micro-batch. An estimate, not a measurement (:class:`StateBytes` measures the state once
    training runs)."""
    parameters = sum(p.numel() for p in model.parameters())
    model_config = model.config
    hidden = int(getattr(model_config, "hidden_size", 0) or getattr(model_config, "d_model", 0) or 0)
    layers = sum(1 for m in model.modules() if isinstance(m, GradientCheckpointingLayer))
    tokens = training.per_device_train_batch_size * max_seq_length
    half = training.bf16 or training.fp16
    activations = tokens * hidden * layers * ACTIVATION_VALUES_PER_UNIT * (1 if half else 2)
    state = parameters * STATE_BYTES_PER_PARAMETER
    return {"parameters": parameters, "state": state, "activations": activations, "total": state + activations}


def choose_sharding(
    requested: str, estimate: dict[str, int], gpu_memory: int | None, world_size: int, written: str | None = None
) -> tuple[str, str]:
    """The mode a run trains with and why, in words with DDP's estimate: ``requested`` unless it is ``auto``, which
    keeps the mode a resumed checkpoint was ``written`` in, else is fsdp when DDP's estimate does not fit the
    smallest visible GPU (``gpu_memory``, bytes; None on CPU) and there are ranks to shard over. The one rule for the
    ranks, the banner and run.json."""
    need = f"DDP needs about {gib(estimate['total'])} a rank ({gib(estimate['state'])} of weights, gradients and "
    need += f"AdamW state for {estimate['parameters']:,} parameters, {gib(estimate['activations'])} of activations)"
    if requested != "auto":
        return requested, f"{requested} (MLM_SHARDING); {need}"
    if written is not None:
        return written, f"{written} (auto: the mode the resumed checkpoint was written in); {need}"
    if gpu_memory is None:
        return "ddp", f"ddp (auto: on CPU there is no device memory to fit); {need}"
    room = f"{USABLE_SHARE:.0%} of the smallest GPU's {gib(gpu_memory)}"
    if world_size < 2:
        return "ddp", f"ddp (auto: one rank, nothing to shard over); {need}, {room}"
    if estimate["total"] > USABLE_SHARE * gpu_memory:
        return "fsdp", f"fsdp (auto: more than {room}); {need}"
    return "ddp", f"ddp (auto: within {room}); {need}"


def gib(size: int) -> str:
    """A size as the estimate shows it: GiB from 1 GiB up, MiB below (a small model's 0.0 GiB would say nothing)."""
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def planned_estimate(model: ModelArguments, training: TrainingArguments, max_seq_length: int) -> dict[str, int] | None:
    """DDP's estimate before any rank starts (``plan``, ``doctor``): the model built on the meta device, which
    holds no memory, from a scratch architecture (its vocabulary the tokenizer_vocab_size it will be trained with)
    or a pretrained model's config.json when it is on disk or in the hub cache. None when that config cannot be
    read here (a hub model not downloaded yet): the ranks estimate once they have it."""
    try:
        arch = scratch_config(model)
        if arch is not None:
            if "vocab_size" not in (model.config_overrides or "") and model.tokenizer_vocab_size:
                arch.vocab_size = model.tokenizer_vocab_size
        else:
            arch = AutoConfig.from_pretrained(model.model_name_or_path, local_files_only=True)
        with torch.device("meta"):
            on_meta = AutoModelForMaskedLM.from_config(arch)
    except Exception:  # noqa: BLE001 - any config this cannot read: the ranks will say what is wrong with it
        return None
    return ddp_estimate(on_meta, training, max_seq_length)
