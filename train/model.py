"""Tokenizer and model: from the hub, a local directory, or an architecture trained from scratch.

``model_name_or_path`` may be a hub id, a local directory with weights, or an architecture without weights: a
``config.json`` (file, or a directory holding only it) or ``scratch:<model_type>`` plus ``config_overrides``.
Without a tokenizer for a from-scratch model, a WordPiece tokenizer is trained on the training text and cached.
The masked-only head computes the vocabulary projection at masked positions alone; the model stays standard.
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer, PreTrainedTokenizerFast
from transformers.modeling_outputs import MaskedLMOutput

from train.config import Config
from train.data import RawData
from train.errors import ConfigError, first_line
from train.hf import cache_key, cache_root, offline_hint

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
SPECIAL_TOKENS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}


def scratch_config(config: Config) -> Any | None:
    """The architecture to build without weights, or None when the model is pretrained."""
    name = config.job.model_name_or_path
    path = Path(name).expanduser()
    if name.startswith("scratch:"):
        model_type = name.split(":", 1)[1]
        try:
            arch = AutoConfig.for_model(model_type)
        except ValueError:
            raise ConfigError(
                f"{config.source_of('model_name_or_path')}={name!r}: unknown model type {model_type!r}; "
                "expected e.g. scratch:distilbert or scratch:bert"
            ) from None
    elif path.is_file() and path.suffix == ".json":
        arch = _config_from_json(path, config)
    elif path.is_dir() and (path / "config.json").exists() and not any((path / f).exists() for f in WEIGHT_FILES):
        arch = _config_from_json(path / "config.json", config)
    else:
        if name.startswith(("/", ".", "~")) and not path.exists():
            raise ConfigError(f"{config.source_of('model_name_or_path')}={name!r}: no such local model directory")
        return None
    if config.job.config_overrides:
        try:
            arch.update_from_string(config.job.config_overrides)
        except ValueError as exc:
            raise ConfigError(f"{config.source_of('config_overrides')}: {exc}") from None
    check_model_config(config, arch)
    return arch


def check_model_config(config: Config, arch: Any) -> None:
    """The model config's own validation, which ``save_pretrained`` runs (transformers 5.x ``validate``): a config
    the model takes at build time but rejects at its first save would otherwise fail after all the training."""
    validate = getattr(arch, "validate", None)
    if validate is None:
        return
    try:
        validate()
    except Exception as exc:  # noqa: BLE001 - huggingface_hub's StrictDataclassError and the validators' own
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        why = lines[-1] if lines else type(exc).__name__  # the validator's reason comes after its name
        label = (
            config.source_of("config_overrides")
            if config.job.config_overrides
            else config.source_of("model_name_or_path")
        )
        raise ConfigError(f"{label}: the model rejects this config ({why[:200]})") from None


def _config_from_json(path: Path, config: Config) -> Any:
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
        return AutoConfig.for_model(**values)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{config.source_of('model_name_or_path')}={str(path)!r}: not a model config.json ({exc})"
        ) from None


def train_wordpiece(raw: RawData, config: Config) -> PreTrainedTokenizerFast:
    """A BERT-style lower-case WordPiece tokenizer trained on the training text, cached by the data's fingerprint."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    job = config.job
    directory = cache_root() / "tokenizers" / cache_key(raw.fingerprint, job.tokenizer_vocab_size, job.text_column)
    if (directory / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(directory))

    tokenizer = Tokenizer(models.WordPiece(unk_token=SPECIAL_TOKENS["unk_token"]))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    # Its progress bar ends with blank lines on stdout, which a JSON-lines reader cannot parse: only on a terminal.
    trainer = trainers.WordPieceTrainer(
        vocab_size=job.tokenizer_vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        show_progress=sys.stdout.isatty(),
    )
    train = raw.splits["train"]
    tokenizer.train_from_iterator(
        (batch[job.text_column] for batch in train.iter(batch_size=10000)), trainer=trainer, length=len(train)
    )
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=job.max_seq_length, **SPECIAL_TOKENS)
    tmp = directory.with_name(directory.name + f".tmp-{os.getpid()}")
    fast.save_pretrained(str(tmp))
    try:
        os.replace(tmp, directory)  # atomic: a concurrent or crashed writer never leaves half a tokenizer
    except OSError:
        pass  # another process won the race; its copy is identical
    return fast


def load_tokenizer(config: Config, raw: RawData, from_scratch: bool) -> Any:
    job = config.job
    name = job.tokenizer_name or (None if from_scratch else job.model_name_or_path)
    if name is None:
        return train_wordpiece(raw, config)
    source = config.source_of("tokenizer_name" if job.tokenizer_name else "model_name_or_path")
    if name.startswith(("/", ".", "~")) and not Path(name).expanduser().exists():
        raise ConfigError(f"{source}={name!r}: no such local tokenizer directory")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=job.trust_remote_code)
    except (OSError, ValueError) as exc:
        if Path(name).expanduser().exists():
            raise ConfigError(f"{source}={name!r}: no tokenizer found there ({first_line(exc)})") from None
        hint = offline_hint("tokenizer", source)
        raise ConfigError(f"{source}={name!r}: cannot load the tokenizer ({hint})") from None
    if tokenizer.mask_token is None:
        raise ConfigError(f"{source}={name!r}: the tokenizer has no mask token; masked-LM training needs one")
    return tokenizer


def load_model(config: Config, arch: Any | None, tokenizer: Any) -> Any:
    """The masked-LM model, with its positions checked against max_seq_length (again: :func:`check_before_data`
    may not have been able to read a pretrained model's config)."""
    job = config.job
    if arch is not None:
        overrides = job.config_overrides or ""
        if "vocab_size" not in overrides:
            arch.vocab_size = len(tokenizer)
        elif arch.vocab_size < len(tokenizer):
            raise ConfigError(
                f"{config.source_of('config_overrides')}: vocab_size={arch.vocab_size} is smaller than the "
                f"tokenizer's {len(tokenizer)} tokens"
            )
        arch.pad_token_id = tokenizer.pad_token_id
        check_model_config(config, arch)  # again, with the tokenizer's vocabulary and padding id
        model = AutoModelForMaskedLM.from_config(arch, attn_implementation="sdpa")
    else:
        name = job.model_name_or_path
        try:
            model = AutoModelForMaskedLM.from_pretrained(
                name, trust_remote_code=job.trust_remote_code, attn_implementation="sdpa"
            )
        except (OSError, ValueError) as exc:
            source = config.source_of("model_name_or_path")
            if Path(name).expanduser().exists():
                raise ConfigError(f"{source}={name!r}: cannot load the model ({first_line(exc)})") from None
            hint = offline_hint("model", source)
            raise ConfigError(f"{source}={name!r}: cannot load the model ({hint})") from None
    check_positions(config, model.config)
    return model


def check_positions(config: Config, model_config: Any) -> None:
    """max_seq_length must fit the model's position embeddings (ConfigError naming both otherwise)."""
    positions = getattr(model_config, "max_position_embeddings", None)
    if positions is not None and config.job.max_seq_length > positions:
        raise ConfigError(
            f"{config.source_of('max_seq_length')}={config.job.max_seq_length}: expected at most {positions}, "
            "the model's max_position_embeddings"
        )


def check_before_data(config: Config, arch: Any | None) -> None:
    """What can be checked of the model before any data is read or tokenized (minutes on a large corpus): the
    architecture's positions against max_seq_length. A pretrained model's config.json is read for it (a small
    file, from a directory or the hub cache only: never a request, the hub may be unreachable and its retries
    belong to load_tokenizer, which says what to do about them); when it cannot be read here, :func:`load_model`
    says why after the data, as before."""
    if arch is None:
        try:
            arch = AutoConfig.from_pretrained(
                config.job.model_name_or_path, trust_remote_code=config.job.trust_remote_code, local_files_only=True
            )
        except (OSError, ValueError):
            return
    check_positions(config, arch)


def _masked_only_parts(model: Any) -> tuple[Any, Any] | None:
    """(encoder, head-on-hidden-states) for the architectures whose MLM head we know how to slice."""
    if hasattr(model, "distilbert") and hasattr(model, "vocab_projector"):

        def head(hidden: torch.Tensor) -> torch.Tensor:
            x = model.vocab_layer_norm(model.activation(model.vocab_transform(hidden)))
            return model.vocab_projector(x)

        return model.distilbert, head
    if hasattr(model, "bert") and hasattr(model, "cls"):
        return model.bert, model.cls.predictions
    return None


def use_masked_only_head(model: Any) -> None:
    """Train with the vocabulary projection computed at masked positions only.

    The loss is the dense head's exactly: cross-entropy averaged over the masked positions, which are the only
    positions whose labels are not ignored. Evaluation (and anything without labels) uses the model's own forward.
    The forward is replaced on this instance only, before DDP wraps it, so gradients still synchronise; the saved
    model is the unchanged architecture.
    """
    parts = _masked_only_parts(model)
    if parts is None:
        raise ConfigError(
            f"masked_only_head: not supported for {type(model).__name__}; expected a DistilBERT or BERT masked LM"
        )
    encoder, head = parts
    dense_forward = model.forward

    def forward(self: Any, input_ids: Any = None, attention_mask: Any = None, labels: Any = None, **kwargs: Any) -> Any:
        if labels is None or not self.training:
            return dense_forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs)
        hidden = encoder(input_ids=input_ids, attention_mask=attention_mask)[0]
        selected = labels != -100
        logits = head(hidden[selected])
        loss = F.cross_entropy(logits.float(), labels[selected], reduction="sum") / selected.sum().clamp(min=1)
        return MaskedLMOutput(loss=loss, logits=None)

    model.forward = types.MethodType(forward, model)
