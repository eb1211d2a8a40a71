"""The model card, final/README.md: hub metadata, the results, the data and how the model was trained, how to use
it. The fixed text is the template card.md beside this module (shipped with train/); this module only computes
the values it is filled with, so the card reads as the file a person will see.

The model is described by train/config/model_source.py, the rule the job built it by: a run trained from a config.json
(or a directory holding only one) says it was trained from scratch, and only a hub model is named ``base_model``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

from train.common.hf import is_hub_dataset
from train.common.mixture import dataset_names
from train.common.rollbacks import rollback_words
from train.config import SECRET_FIELDS
from train.config.model_source import model_source
from train.model.adapting import DRIFT_WARNING
from train.publish.common import read_json

CARD = "README.md"
CARD_TAGS = ["fill-mask", "masked-lm", "mlm-trainer"]
TEMPLATE = "card.md"
NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class CardTarget:
    """Where the card goes and what it says of final/'s files."""

    repo_id: str | None = None  # where final/ is pushed (None: not pushed)
    mask: str = "[MASK]"  # the tokenizer's mask token, for the example
    weights: str | None = None  # the weights' SHA-256 as final/'s marker lists them (checkpoints.weights_digest)


def model_card(
    resolved: Mapping[str, Any],
    sources: Mapping[str, str],
    run: dict[str, Any],
    results: dict[str, Any],
    step: int,
    target: CardTarget = CardTarget(),
) -> str:
    """README.md for final/, from the run's options (``resolved``: ``Config.as_dict()``, and ``sources``: where each
    set one came from), ``run`` (run.json) and ``results`` (all_results.json) after ``step`` steps, for ``target``
    (where it is pushed, the mask token, the weights' digest)."""
    repo_id, mask, weights = target.repo_id, target.mask, target.weights
    values = {
        **header_values(resolved, repo_id),
        **result_values(resolved, run, results, step),
        **data_values(resolved, run, results),
        **training_values(run, results),
        "where": repo_id or "path/to/final",
        "mask": mask,
        "options": json.dumps(chosen_options(resolved, sources, run), indent=2, sort_keys=True, default=str),
        "weights": weights or "not recorded",
    }
    return card_template().substitute(values)


def card_template() -> Template:
    """card.md, read from the package (a missing placeholder value is a KeyError, never a silent gap)."""
    return Template(resources.files(__package__).joinpath(TEMPLATE).read_text(encoding="utf-8"))


def header_values(resolved: Mapping[str, Any], repo_id: str | None) -> dict[str, str]:
    """The hub metadata (a hub base model and a hub dataset are linked), the title and the model's description."""
    from huggingface_hub import ModelCardData  # costly: loaded when a card is written

    source = model_source(resolved["model_name_or_path"], resolved["config_overrides"])
    metadata = ModelCardData(
        library_name="transformers",
        pipeline_tag="fill-mask",
        tags=CARD_TAGS,
        base_model=source.name if source.kind == "hub" else None,
        datasets=[n for n in dataset_names(resolved["dataset"], "dataset") if is_hub_dataset(n)] or None,
    ).to_yaml()
    name = (repo_id or resolved.get("hub_model_id") or "mlm-trainer model").split("/")[-1]
    return {"metadata": metadata.rstrip(), "name": name, "model": source.description}


def result_values(
    resolved: Mapping[str, Any], run: dict[str, Any], results: dict[str, Any], step: int
) -> dict[str, str]:
    """The final evaluation and throughput, and the steps with the global batch they were taken in."""
    return {
        "eval_loss": _number(results.get("eval_loss"), ".4f"),
        "perplexity": _number(results.get("perplexity"), ".2f"),
        "eval_accuracy": _number(results.get("eval_accuracy"), ".4f"),
        "steps": f"{step:,}",
        "global_batch": global_batch(resolved, run, results),
        "tokens_per_second": _number(results.get("train_tokens_per_second"), ",.0f"),
        "encoder_cosine": drift_text(results.get("eval_encoder_cosine")),
    }


def drift_text(cosine: Any) -> str:
    """An adapted encoder's mean cosine to the model handed over, warned of below DRIFT_WARNING (as the logs do)."""
    if not isinstance(cosine, (int, float)):
        return "not measured (only for a model handed over, when evaluated)"
    if cosine < DRIFT_WARNING:
        return (
            f"**{cosine:.3f}: below {DRIFT_WARNING}, the encoder moved far from the model it was adapted from**; "
            "its embeddings may no longer serve what the original's did"
        )
    return f"{cosine:.3f}"


def global_batch(resolved: Mapping[str, Any], run: dict[str, Any], results: dict[str, Any]) -> str:
    """Samples per optimizer step: per-device batch x world size x accumulation, as run.json recorded them (else
    as ``resolved``); under a batch warm-up, where it grew from."""
    options = run.get("config") or resolved
    world = run.get("world_size") or results.get("world_size")
    if not world:
        return "?"
    per_device = int(options.get("per_device_train_batch_size") or 0)
    full = str(per_device * int(world) * int(options.get("gradient_accumulation_steps") or 1))
    warmup = run.get("batch_warmup")
    if not warmup:
        return full
    return f"{full}, from {warmup['first_rows']} over the first {warmup['ratio']:.0%} of the steps"


def data_values(resolved: Mapping[str, Any], run: dict[str, Any], results: dict[str, Any]) -> dict[str, str]:
    """The dataset, its fingerprint, the sample counts and how the text became examples."""
    config_name, final_rate = resolved["dataset_config_name"], resolved["final_mlm_probability"]
    return {
        "dataset": resolved["dataset"],
        "dataset_config": f" (config `{config_name}`)" if config_name else "",
        "fingerprint": run.get("dataset_fingerprint") or "unknown",
        "train_samples": _count(results.get("train_samples")),
        "eval_samples": _count(results.get("eval_samples")),
        "max_seq_length": str(resolved["max_seq_length"]),
        "padding": resolved["padding"],
        "mlm_probability": f"{resolved['mlm_probability']:g}"
        + (f" to {final_rate:g} (linearly)" if final_rate is not None else ""),
        # A resume on data that changed since its checkpoint (MLM_RESUME_ON_CHANGED_DATA): the model saw both.
        "data_changed": "; ".join(map(str, run.get("resumed_on_changed_data") or [])) or "no",
    }


def training_values(run: dict[str, Any], results: dict[str, Any]) -> dict[str, str]:
    """Where and with what it ran: processes, precision, library versions, the image, the times."""
    hardware = run.get("hardware") or {}
    versions = run.get("versions") or {}
    return {
        "world_size": str(run.get("world_size") or results.get("world_size") or "?"),
        "precision": hardware.get("precision") or "as configured",
        "versions": " · ".join(f"{k} {v}" for k, v in versions.items()) or "unknown",
        "image_revision": run.get("image_revision") or "unknown",
        "rollbacks": rollback_words(run.get("rollbacks")) or "none recorded",
        "started": str(run.get("started", "?")),
        "ended": str(run.get("ended", "?")),
    }


def chosen_options(resolved: Mapping[str, Any], sources: Mapping[str, str], run: dict[str, Any]) -> dict[str, Any]:
    """The options set for this run (``sources``' names: not left at their default), as run.json recorded them
    (else as ``resolved``): secrets never."""
    options = run.get("config") or resolved
    return {key: options.get(key) for key in sorted(sources) if key in options and key not in SECRET_FIELDS}


def _number(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else NOT_MEASURED


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"


def mask_token(final: Path) -> str:
    """The tokenizer's mask token as final/ saved it (``[MASK]`` for BERT-like tokenizers)."""
    mask = read_json(final / "tokenizer_config.json").get("mask_token")
    if isinstance(mask, dict):  # an AddedToken, serialized
        mask = mask.get("content")
    return mask if isinstance(mask, str) and mask else "[MASK]"


def write_card(final: Path, text: str) -> None:
    """final/README.md, replaced in one step (final/ stays whole at every moment)."""
    tmp = final / f".{CARD}.tmp-{os.getpid()}"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, final / CARD)
