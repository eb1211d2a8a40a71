"""Tokenizer and model: from the hub, a local directory, or an architecture trained from scratch.

``model_name_or_path`` may be a hub id, a local directory with weights, or an architecture without weights: a
``config.json`` (file, or a directory holding only it) or ``scratch:<model_type>`` plus ``config_overrides``; which
one a name is, train/config/model_source.py decides (for doctor and the model card too).
Without a tokenizer for a from-scratch model, one of its family's kind is trained on the training text and cached.
The attention implementation is the model's best (:func:`attention_implementation`); the masked-only head is
train/model/head.py.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import importlib.util
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer, PreTrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING
from transformers.utils import logging as hf_logging

from train.borrowed.transformers_models import supports_flash_attention
from train.common import distributed
from train.common.console import first_few, warn
from train.common.errors import ConfigError, first_line
from train.common.hf import looks_local, offline_hint
from train.common.untrusted import SAFE_LOAD_REFUSED, safe_load_problem
from train.config import DataArguments, ModelArguments
from train.config.model_source import SHARDED_WEIGHTS, model_source
from train.data import RawData
from train.model.tokenizer_training import checkpoint_tokenizer, tokenizer_kind, train_tokenizer
from train.model.weights import encoder_missing, head_state


def scratch_config(model: ModelArguments) -> Any | None:
    """The architecture to build without weights (train/config/model_source.py says which names are one), or None when
    the model is pretrained; a local model path that is not there is a ConfigError before any data is read."""
    name, label = model.model_name_or_path, model.source_of("model_name_or_path")
    source = model_source(name, model.config_overrides)
    if source.pretrained:
        if source.path is not None and not source.path.exists():
            raise ConfigError(f"{label}={name!r}: no such local model directory")
        if source.path is not None and (source.path / SHARDED_WEIGHTS).is_dir():
            raise ConfigError(
                f"{label}={name!r}: a checkpoint written under MLM_SHARDING=fsdp, its weights in shards "
                f"({SHARDED_WEIGHTS}/), not a model; resume it (MLM_RESUME={name}) or start from the run's final/"
            )
        return None
    values = source.config_values(label)
    arch = _build(values, label, name)
    if model.config_overrides:
        # As constructor arguments, so that the fields a config derives from others in its constructor follow
        # them (ModernBERT's layer_types from num_hidden_layers: update_from_string on a built config leaves them
        # stale, and the first save then refuses the config).
        overrides_label = model.source_of("config_overrides")
        arch = _build(
            {**values, **override_values(arch, model.config_overrides, overrides_label)}, overrides_label, name
        )
    check_model_config(model, arch)
    check_masked_lm(model, arch)
    return arch


def override_values(arch: Any, overrides: str, label: str) -> dict[str, Any]:
    """``config_overrides`` as constructor arguments: a JSON object (what a YAML mapping becomes: lists such as
    ModernBERT's ``layer_types``) as given; ``key=value,...`` converted as transformers' ``update_from_string``
    does, by the type of each field's current value. A key that is no field of ``arch`` is a ConfigError."""
    if overrides.lstrip().startswith("{"):
        values = dict(json.loads(overrides))  # the Bound has checked it is an object
        check_override_keys(arch, values, label, mapping=True)
        return values
    check_override_keys(arch, (pair.split("=", 1)[0] for pair in overrides.split(",") if "=" in pair), label, False)
    converted = copy.deepcopy(arch)
    try:
        converted.update_from_string(overrides)
    except (
        ValueError,
        TypeError,
    ) as exc:  # TypeError: a field whose default is None or a list has no type to convert to
        raise ConfigError(
            f"{label}: {first_line(exc)}; a field the pairs cannot set takes a JSON object (in YAML a mapping)"
        ) from None
    return {key: getattr(converted, key) for key in (pair.split("=", 1)[0] for pair in overrides.split(","))}


def check_override_keys(arch: Any, keys: Iterable[str], label: str, mapping: bool) -> None:
    """Each key must be a field of the model's config (an attribute, or a name it maps to one, as distilbert's
    num_hidden_layers is its n_layers: update_from_string's own rule), said with the nearest field: the pairs'
    own error says only "isn't in the original config dict". In a mapping (JSON, YAML) a key the config has no
    default for can still be one the model's code reads (DeBERTa-v2's conv_kernel_size, through getattr): it is
    refused only when a field's name is near it (a typo: num_layers for n_layers, which would otherwise train the
    default architecture without a word)."""
    for key in keys:
        if hasattr(arch, key):
            continue
        fields = [name for name in arch.to_dict() if not name.startswith("_")]
        common = set(PreTrainedConfig().to_dict())  # the fields every model's config has
        own = [name for name in fields if name not in common]
        near = difflib.get_close_matches(key, fields, n=1)
        if mapping and not near:
            continue
        hint = f"did you mean {near[0]!r}?" if near else f"expected one of {', '.join(own)}"
        model_type = getattr(arch, "model_type", "model")
        raise ConfigError(f"{label}: {key!r} is not a field of the {model_type} config; {hint}")


def check_masked_lm(model: ModelArguments, model_config: Any) -> None:
    """The model type must have a masked-LM class in transformers (AutoModelForMaskedLM): a decoder (gpt2) or an
    encoder without an MLM head would otherwise fail after the tokenizing, at load time."""
    if type(model_config) in MODEL_FOR_MASKED_LM_MAPPING or model.trust_remote_code:
        return
    model_type = getattr(model_config, "model_type", "?")
    raise ConfigError(
        f"{model.source_of('model_name_or_path')}={model.model_name_or_path!r}: {model_type!r} has no "
        "masked-LM class in transformers (AutoModelForMaskedLM); expected an encoder such as bert, roberta, "
        "deberta-v2 or modernbert"
    )


def _build(values: dict[str, Any], label: str, name: str) -> Any:
    try:
        return AutoConfig.for_model(**values)
    except Exception as exc:  # noqa: BLE001 - ValueError, TypeError, huggingface_hub's StrictDataclassError
        if isinstance(exc, ValueError) and "Unrecognized model identifier" in str(exc):
            raise ConfigError(
                f"{label}={name!r}: unknown model type {values.get('model_type')!r}; expected e.g. scratch:distilbert "
                "or scratch:bert"
            ) from None
        raise ConfigError(f"{label}: the model rejects this config ({_reason(exc)})") from None


def _reason(exc: BaseException) -> str:
    """A config validator's reason: huggingface_hub names the validator on the first line and the reason last."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:200]


def check_model_config(model: ModelArguments, arch: Any) -> None:
    """The model config's own validation, which ``save_pretrained`` runs (transformers 5.x ``validate``): a config
    the model takes at build time but rejects at its first save would otherwise fail after all the training."""
    validate = getattr(arch, "validate", None)
    if validate is None:
        return
    try:
        validate()
    except Exception as exc:  # noqa: BLE001 - huggingface_hub's StrictDataclassError and the validators' own
        why = _reason(exc)
        label = model.source_of("config_overrides" if model.config_overrides else "model_name_or_path")
        raise ConfigError(f"{label}: the model rejects this config ({why})") from None


def load_tokenizer(
    model: ModelArguments, data: DataArguments, raw: RawData, arch: Any | None, resume: str | None = None
) -> Any:
    """MLM_TOKENIZER_NAME's, the pretrained model's, or for a model built from scratch (``arch``) one trained on
    the training text of the kind its family uses (train/model/tokenizer_training.py; ``data`` says which column
    and how long a sequence): the checkpoint's when resuming."""
    name = None if trains_its_tokenizer(model, arch) else model.tokenizer_name or model.model_name_or_path
    if name is None:
        kind = tokenizer_kind(model.tokenizer_type, getattr(arch, "model_type", None))
        return checkpoint_tokenizer(resume) or train_tokenizer(raw, model, data, kind)
    source = tokenizer_label(model)
    if looks_local(name) and not Path(name).expanduser().exists():
        raise ConfigError(f"{source}={name!r}: no such local tokenizer directory")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=model.trust_remote_code)
    except (OSError, ValueError) as exc:
        if Path(name).expanduser().exists():
            raise ConfigError(f"{source}={name!r}: no tokenizer found there ({first_line(exc)})") from None
        hint = offline_hint("tokenizer", source)
        raise ConfigError(f"{source}={name!r}: cannot load the tokenizer ({hint})") from None
    if tokenizer.mask_token is None:
        raise ConfigError(f"{source}={name!r}: the tokenizer has no mask token; masked-LM training needs one")
    return tokenizer


def trains_its_tokenizer(model: ModelArguments, arch: Any | None) -> bool:
    """No tokenizer named: one is trained on the training text (:func:`load_tokenizer`)."""
    return not model.tokenizer_name and arch is not None


def tokenizer_label(model: ModelArguments) -> str:
    """The option that chose the tokenizer (MLM_TOKENIZER_NAME, else the model's), for messages about it."""
    return model.source_of("tokenizer_name" if model.tokenizer_name else "model_name_or_path")


def load_model(
    model: ModelArguments, data: DataArguments, arch: Any | None, tokenizer: Any, model_config: Any | None = None
) -> tuple[Any, str | None]:
    """The masked-LM model, with its positions checked against ``data``'s max_seq_length (again:
    :func:`check_before_data` may not have been able to read a pretrained model's config; ``model_config`` is what
    it read, or None), and what its weights lacked of its MLM head (train/model/weights.py: None when loaded whole or
    from scratch). transformers' load report is not shown: its words are for fine-tuning, and the head is said in
    ours."""
    head = None
    if arch is not None:
        overrides = model.config_overrides or ""
        if "vocab_size" not in overrides:
            arch.vocab_size = len(tokenizer)
        elif arch.vocab_size < len(tokenizer):
            raise ConfigError(
                f"{model.source_of('config_overrides')}: vocab_size={arch.vocab_size} is smaller than the "
                f"tokenizer's {len(tokenizer)} tokens"
            )
        use_tokenizers_special_tokens(arch, tokenizer)
        check_model_config(model, arch)  # again, with the tokenizer's vocabulary and padding id
        masked_lm = AutoModelForMaskedLM.from_config(arch, attn_implementation=attention_implementation(model, arch))
    else:
        name = model.model_name_or_path
        refuse_unsafe_weights(model, Path(name).expanduser())
        try:
            with quiet_transformers():
                masked_lm, loading = AutoModelForMaskedLM.from_pretrained(
                    name,
                    trust_remote_code=model.trust_remote_code,
                    attn_implementation=attention_implementation(model, model_config),
                    output_loading_info=True,
                )
        except Exception as exc:
            source = model.source_of("model_name_or_path")
            if SAFE_LOAD_REFUSED in str(exc):  # pickled weights from the hub, refused by the safe loader
                raise ConfigError(
                    f"{source}={name!r}: the safe loader refuses its weights ({first_line(exc)}); {CONVERT}"
                ) from None
            if not isinstance(exc, (OSError, ValueError, SafetensorError)):  # SafetensorError: a damaged file
                raise
            if Path(name).expanduser().exists():
                raise ConfigError(f"{source}={name!r}: cannot load the model ({first_line(exc)})") from None
            hint = offline_hint("model", source)
            raise ConfigError(f"{source}={name!r}: cannot load the model ({hint})") from None
        head = head_state(masked_lm, loading["missing_keys"])
        lacking = encoder_missing(masked_lm, loading["missing_keys"])
        if lacking and distributed.is_world_zero():
            shown = first_few(lacking)
            warn(f"{name}: {len(lacking)} tensor(s) of the encoder are not in its weights and start random: {shown}")
    check_positions(data, masked_lm.config)
    return masked_lm, head


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' warnings off for a moment (its load report and the tied-weights line), then as they were."""
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)


CONVERT = (
    "pickled weights that could run code are never loaded: convert them to safetensors where they were made "
    "(model.save_pretrained(directory) writes model.safetensors)"
)


def unsafe_weights(directory: Path) -> str | None:
    """Why a local model's pickled weights cannot be loaded the safe way, naming the file; None when they can.
    Checked as transformers will load them: safetensors, preferred by transformers when present, need no check."""
    if not directory.is_dir() or any(directory.glob("*.safetensors")):
        return None
    for weights in sorted(directory.glob("pytorch_model*.bin")):
        problem = safe_load_problem(weights)
        if problem:
            return problem
    return None


def refuse_unsafe_weights(model: ModelArguments, directory: Path) -> None:
    """ConfigError naming the file (:func:`unsafe_weights`) and how to convert it, before any weight is read."""
    problem = unsafe_weights(directory)
    if problem:
        source = model.source_of("model_name_or_path")
        raise ConfigError(f"{source}={str(directory)!r}: {problem}; {CONVERT}")


# What loading a tokenizer from a directory adds to its saved config: how it was loaded, not what it is.
LOADING_DETAILS = ("is_local", "local_files_only")


def settle_tokenizer(tokenizer: Any) -> None:
    """The tokenizer as final/ should hold it, whatever this run did with it: no truncation or padding state left
    in its backend by tokenizing (a run that read its data from the cache tokenized nothing), and no record of
    where it was loaded from. A replay then writes the same files (train/launch/replay.py)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        backend.no_truncation()
        backend.no_padding()
    for name in LOADING_DETAILS:
        tokenizer.init_kwargs.pop(name, None)


def attention_implementation(model: ModelArguments, model_config: Any | None) -> str | None:
    """MLM_ATTN_IMPLEMENTATION when set; else flash_attention_2 where it is installed, a GPU is there and the model
    supports it; else None: transformers' own choice, SDPA where the model has it and eager where not (DeBERTa,
    MPNet: asking them for SDPA fails). The model's config then says which one ran (read by
    train/borrowed/transformers_models.py)."""
    requested = model.attn_implementation
    if requested != "auto":
        return requested
    if model_config is None or not torch.cuda.is_available() or importlib.util.find_spec("flash_attn") is None:
        return None
    model_class = MODEL_FOR_MASKED_LM_MAPPING.get(type(model_config), None)
    return "flash_attention_2" if supports_flash_attention(model_class) else None


def pretrained_config(model: ModelArguments) -> Any | None:
    """A pretrained model's config, from a local directory or the hub cache only (never a request: the hub may be
    unreachable, and load_model's own request says what to do about it); None when it is not there."""
    try:
        return AutoConfig.from_pretrained(
            model.model_name_or_path, trust_remote_code=model.trust_remote_code, local_files_only=True
        )
    except (OSError, ValueError):
        return None


# A BERT-style tokenizer has [CLS] and [SEP] where a RoBERTa-style config speaks of <s> (bos) and </s> (eos).
SPECIAL_ID_FALLBACK = {"bos": "cls", "eos": "sep"}


def use_tokenizers_special_tokens(arch: Any, tokenizer: Any) -> None:
    """A from-scratch config's special-token ids (pad, bos, eos, cls, sep, mask), the tokenizer's: a config's
    defaults are its pretrained vocabulary's (ModernBERT's eos 50282) and point outside a new one."""
    for name in ("pad", "bos", "eos", "cls", "sep", "mask"):
        field = f"{name}_token_id"
        if getattr(arch, field, None) is None and not hasattr(arch, field):
            continue
        found = getattr(tokenizer, field, None)
        if found is None and name in SPECIAL_ID_FALLBACK:
            found = getattr(tokenizer, f"{SPECIAL_ID_FALLBACK[name]}_token_id", None)
        setattr(arch, field, found)


def check_positions(data: DataArguments, model_config: Any) -> None:
    """max_seq_length must fit the model's position embeddings (ConfigError naming both otherwise)."""
    positions = getattr(model_config, "max_position_embeddings", None)
    if positions is not None and data.max_seq_length > positions:
        raise ConfigError(
            f"{data.source_of('max_seq_length')}={data.max_seq_length}: expected at most {positions}, "
            "the model's max_position_embeddings"
        )


def check_before_data(model: ModelArguments, data: DataArguments, arch: Any | None) -> Any | None:
    """What can be checked of the model before any data is read or tokenized (minutes on a large corpus): that it
    is a masked LM, that its positions fit max_seq_length, and that a local model's pickled weights pass the safe
    loader (:func:`refuse_unsafe_weights`; cheap: a memory-mapped load reads the pickle, not the tensors, and
    load_model checks again for its other callers). A pretrained model's config.json is read for it (a
    small file, from a directory or the hub cache only: never a request, the hub may be unreachable and its
    retries belong to load_tokenizer, which says what to do about them); when it cannot be read here,
    :func:`load_model` says why after the data, as before. Returns the config it read (the architecture, the
    pretrained model's, or None), which load_model takes rather than reading it again."""
    if arch is None:
        refuse_unsafe_weights(model, Path(model.model_name_or_path).expanduser())
    model_config = arch if arch is not None else pretrained_config(model)
    if model_config is not None:
        check_masked_lm(model, model_config)
        check_positions(data, model_config)
    return model_config
