"""The launch banner: what the launcher decided and what only the running job knows (data size, steps), as one
record (``logs/train.jsonl``, the JSON console) and as a short block of aligned lines (the text console)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from train.common import durations
from train.common.console import jsonable, now, resolve_format
from train.common.handoff import Handoff, global_batch, precision_label, precision_name
from train.common.phase import PhaseFacts
from train.common.versions import package_versions
from train.config import Config
from train.config.recipes import recipe_summary
from train.data.mixture import mixture_text
from train.outputs.facts import Masking, ModelFacts, Packing, RunFacts, as_json
from train.outputs.runfiles import RunFiles


@dataclass(frozen=True)
class TrainStart:
    """Where training starts, as the Trainer has it when it begins (unknown before: the configuration's)."""

    max_steps: int | None = None  # the steps planned
    world_size: int | None = None
    start_step: int = 0  # a resumed run's first step


def banner_record(
    config: Config, facts: RunFacts, handoff: Handoff | None = None, start: TrainStart = TrainStart()
) -> dict[str, Any]:
    """The launch facts as one record: the launcher's decisions (``handoff``; None when the job was started
    without the launcher) and what only the running job knows (``facts``: data size; ``start``: steps). It takes
    the whole Config because the banner says the configuration across its sections (``config.as_dict()``)."""
    training, model = config.training, facts.model
    world_size = int(start.world_size or training.world_size or 1)
    files = RunFiles(training.output_dir)
    record: dict[str, Any] = {
        "event": "banner",
        "time": now(),
        "image_revision": config.launch.image_revision,
        "versions": package_versions(),
        "launched": handoff is not None,
        "gpus": handoff.gpus if handoff else [],
        "nodes": handoff.nnodes if handoff else None,
        "world_size": world_size,
        # What the ranks run with: the launcher's decision, arrived as the bf16/fp16/tf32 flags.
        "precision": handoff.precision
        if handoff
        else precision_label(precision_name(training.fp16, training.bf16), bool(training.tf32)),
        "global_batch_size": global_batch(
            training.per_device_train_batch_size, world_size, training.gradient_accumulation_steps
        ),
        "per_device_train_batch_size": int(training.per_device_train_batch_size),
        "gradient_accumulation_steps": int(training.gradient_accumulation_steps),
        "batch_warmup": facts.batch_warmup,
        "model": config.model.model_name_or_path,
        "recipe": recipe_summary(
            config.model.recipe, config.model.model_name_or_path, training, config.schedule.decay_ratio
        ),
        "attention": model.attention,
        "head": model.head,
        "head_weights": model.head_weights,
        "masking": as_json(facts.masking),
        "packing": as_json(facts.packing),
        "sharding": as_json(facts.sharding),
        "dataset": config.data.dataset,
        "mixture": facts.mixture,
        "branch": facts.branch,
        "phase": facts.phase,
        "train_samples": facts.train_samples,
        "eval_samples": facts.eval_samples,
        "train_documents": facts.train_documents,
        "eval_documents": facts.eval_documents,
        "train_real_tokens": facts.train_real_tokens,
        "truncation": facts.truncation,
        "max_steps": start.max_steps or (training.max_steps if training.max_steps > 0 else None),
        "num_train_epochs": training.num_train_epochs,
        "start_step": start.start_step,
        "resumed_from_ranks": facts.resumed_from_ranks,
        "deadline": durations.utc_clock(handoff.deadline) if handoff and handoff.deadline else None,
        "output_dir": str(files.root),
        "logs": str(files.logs),
        # output_dir in a store: output_dir above is the staging directory mirrored there.
        "output_store": config.as_dict()["output_store"],
        # a fault drill (train/run/drills.py): this run's divergence is rehearsed, not real
        "fault_drill": config.resilience.inject_fault or None,
        "spike_rollbacks": config.resilience.spike_rollbacks,
    }
    return record


def _drill_lines(drill: str | None) -> list[str]:
    return [f"  drill      a fault drill is on: {drill} (inject_fault)"] if drill else []


def _cut_text(cut: dict[str, int] | None) -> str:
    if not cut or not cut["examples_cut"]:
        return ""
    return f" ({cut['examples_cut']:,} examples cut to max_seq_length, {cut['tokens_cut']:,} tokens dropped)"


def _unit_text(facts: RunFacts) -> str:
    """``samples``, or, when packing made blocks of other numbers, the blocks and the rows they came from (what
    max_train_samples and max_eval_samples count)."""
    documents = (facts.train_documents, facts.eval_documents)
    if documents[0] is None or documents == (facts.train_samples, facts.eval_samples):
        return "samples"
    if facts.mixture and facts.packing and not facts.packing.padding.startswith("packed"):
        return f"samples (mixed from {_count(documents[0])} / {_count(documents[1])} rows of text)"
    return f"blocks (from {_count(documents[0])} / {_count(documents[1])} rows of text)"


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"


def _model_text(model: ModelFacts) -> str:
    said = [f"{model.attention} attention" if model.attention else ""]
    said.append(f"{model.head} head" if model.head else "")
    return f" ({', '.join(s for s in said if s)})" if any(said) else ""


def _masking_text(masking: Masking | None) -> str | None:
    if not masking:
        return None
    unit = "words" if masking.whole_word_mask else "tokens"
    rates = f"{masking.mlm_probability:.0%} of {unit}"
    final = masking.final_mlm_probability
    if final is not None:
        rates += f", {'falling' if final < masking.mlm_probability else 'rising'} linearly to {final:.0%} by the end"
    if masking.eval_mlm_probability != masking.mlm_probability:
        rates += f" ({masking.eval_mlm_probability:.0%} for evaluation)"
    if masking.realised is None:
        return f"  masking    {rates}"
    return (
        f"  masking    {rates}; realised {masking.realised:.1%} of real tokens on {masking.realised_on_samples} samples"
    )


def _warmup_text(warmup: dict[str, Any] | None) -> str:
    if not warmup:
        return ""
    tokens = f" ({warmup['first_tokens']:,} tokens)" if "first_tokens" in warmup else ""
    return (
        f"; warming up from {warmup['first_rows']} rows{tokens}, growing linearly to all of it over the first "
        f"{warmup['ratio']:.0%} of the steps"
    )


def _packing_text(packing: Packing | None) -> str:
    if not packing or packing.efficiency is None:
        return ""
    apart = ", documents apart" if packing.documents_apart else ""
    return f"; padding {packing.padding}{apart}: {packing.efficiency:.1%} of positions are real tokens"


def banner(
    config: Config, facts: RunFacts, handoff: Handoff | None = None, start: TrainStart = TrainStart()
) -> tuple[dict[str, Any], str]:
    """The launch banner: its record (:func:`banner_record`, for logs/train.jsonl) and that record as stdout shows
    it, one JSON line in json format, a short block of aligned lines in text format. It takes the whole Config
    because it assembles the banner from it."""
    record = banner_record(config, facts, handoff, start)
    text = banner_text(
        record, facts, config.launch.log_format, config.training.max_steps, config.data.mixture_exhausted
    )
    return record, text


def banner_text(record: dict[str, Any], facts: RunFacts, log_format: str, max_steps: int, exhausted: str) -> str:
    """``record`` (from banner_record) as the banner: the same record, with its one time stamp, that the log
    file keeps, so stdout and logs/train.jsonl never differ by a second. ``max_steps``: the option (steps, or
    epochs when not above 0); ``exhausted``: a mixture's mixture_exhausted."""
    if resolve_format(log_format) == "json":
        return json.dumps(jsonable(record))
    versions = record["versions"]
    shown = [name for name in ("torch", "transformers", "python") if name in versions]
    version_text = " · ".join(f"{name} {versions[name]}" for name in shown)
    gpus = record["gpus"]
    if gpus:
        names = sorted(set(gpus))
        hardware = f"{len(gpus)} GPU(s) on this node ({', '.join(names)})"
    elif record["launched"]:
        hardware = "CPU (no GPU)"
    else:
        hardware = "as torchrun gave it (started without the launcher)"
    if record["nodes"]:
        hardware += f", {record['nodes']} node(s)"
    steps = record["max_steps"]
    span = "max_steps" if max_steps > 0 else f"{record['num_train_epochs']:g} epoch(s)"
    resumed = f", resuming at step {record['start_step']}" if record["start_step"] else ""
    if resumed and record["resumed_from_ranks"] not in (None, record["world_size"]):
        resumed += f" (resumed from {record['resumed_from_ranks']} ranks on {record['world_size']})"
    phase = PhaseFacts.from_record(facts.phase)
    if phase is not None:
        resumed += f"; {phase.line()}"
    if facts.branch:
        resumed += f"; a branch of {facts.branch['parent']} at step {facts.branch['step']}"
    if record["deadline"]:  # the time budget plans within this bound (train/run/budget.py)
        resumed += f"; at most: a time budget ends the run by {record['deadline']}, planned after a few steps"
    sharding = facts.sharding
    lines = [
        f"mlm-trainer  image {record['image_revision'] or 'unknown'} · {version_text}",
        f"  hardware   {hardware}, world size {record['world_size']}",
        f"  precision  {record['precision']}",
        f"  batch      global {record['global_batch_size']} = {record['world_size']} rank(s) × "
        f"{record['per_device_train_batch_size']} per device × {record['gradient_accumulation_steps']} accumulation"
        + _warmup_text(facts.batch_warmup),
        f"  model      {record['model']}" + _model_text(facts.model),
        *([f"  MLM head   {facts.model.head_weights}"] if facts.model.head_weights else []),
        f"  recipe     {record['recipe']}",
        *([f"  sharding   {sharding.choice}"] if sharding and sharding.choice else []),
        *filter(None, [_masking_text(facts.masking)]),
        (
            f"  data       {record['dataset']}: {_count(facts.train_samples)} train / "
            f"{_count(facts.eval_samples)} eval {_unit_text(facts)}, {_count(facts.train_real_tokens)} "
            "real tokens" + _cut_text(facts.truncation) + _packing_text(facts.packing)
            if facts.train_samples is not None
            else f"  data       {record['dataset']}: streamed (size unknown until read) / "
            f"{_count(facts.eval_samples)} eval samples"
        ),
        *([f"  mixture    {mixture_text(facts.mixture, exhausted)}"] if facts.mixture else []),
        f"  steps      {_count(steps)} ({span}){resumed}",
        f"  outputs    {facts.outputs or record['output_dir']}",  # the output location's summary, from the job
        *_drill_lines(record["fault_drill"]),
    ]
    return "\n".join(lines)
