"""``./entrypoint.sh evaluate [--option value ...]`` (under torchrun, as training runs: one rank or many): a trained
model or a checkpoint (``MLM_MODEL_NAME_OR_PATH``) scored on the held-out text the same data options give training
(``validation_file``, the ``validation_split_percentage`` held out of ``dataset``, or a stream's first
``max_eval_samples``), masked as training's evaluation masks (``eval_mlm_probability``, the same seed: the same
positions), nothing trained.

World rank 0 prints one line (JSON with ``MLM_LOG_FORMAT=json``) and writes ``eval_results.json`` where the outputs
live (``MLM_OUTPUT_DIR``: a directory, or a bucket through its staging directory). What transformers lacks: the
Trainer evaluates only inside a training script, and run_mlm.py's ``--do_eval`` alone reads and tokenizes the
training split too; here only the held-out text is read.
"""

from __future__ import annotations

import hashlib
import math
import shutil
from dataclasses import dataclass
from typing import Any

from datasets import DatasetDict
from transformers import TrainingArguments
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from train.commands.results import write_results
from train.commands.start import start
from train.common import distributed
from train.common.console import resolve_format, say
from train.common.errors import ConfigError
from train.common.hf import CACHE_KEY_CHARS, cache_root
from train.common.urls import is_store_url
from train.config import Config, DataArguments, ModelArguments
from train.config.model_source import model_source
from train.data import RawData, load_raw, tokenize
from train.data.tokenization import IndexedExamples, joined
from train.model.collator import MaskingCollator
from train.model.load import check_before_data, load_model, load_tokenizer
from train.outputs.location import output_location
from train.outputs.verify import fetch
from train.run.batches import argmax_logits, evaluation_metrics, masking_collator
from train.run.logs import bars_drawn
from train.run.model_setup import with_head
from train.run.trainer import MLMTrainer, losses_are_batch_means
from train.run.trainer_settings import TrainerSettings, evaluation_settings

EVAL_RESULTS = "eval_results.json"


def held_out(raw: RawData, data: DataArguments) -> RawData:
    """The evaluation text alone of ``raw`` (the data options' text, as training would hold it out); ConfigError
    when the options hold none out."""
    if "validation" not in raw.splits or not len(raw.splits["validation"]):
        raise ConfigError(
            f"{data.source_of('dataset')}={data.dataset!r}: nothing is held out to evaluate on; set "
            "validation_file, validation_split_percentage above 0, or (streaming) max_eval_samples"
        )
    parts = tuple(
        (part, RawData(DatasetDict({"validation": r.splits["validation"]}), r.fingerprint))
        for part, r in raw.parts or ()
        if "validation" in r.splits
    )
    return RawData(DatasetDict({"validation": raw.splits["validation"]}), raw.fingerprint, parts=parts or None)


def scored_data(data: DataArguments) -> str:
    """The data an evaluation scores, in words for its line and results: the held-out file, else the held-out part
    of the dataset option's data. A model is scored on what the options name, never on what its run.json says it was
    trained on (docs/trust.md), so the demo's sentences, when nothing is named, are said to be only that."""
    if data.validation_file:
        return f"{data.validation_file} ({data.source_of('validation_file')})"
    if "dataset" not in data.sources and data.dataset == "demo":
        return "the built-in demo sentences (MLM_DATASET is not set: name the data to score)"
    return f"{data.dataset} ({data.source_of('dataset')}, its held-out part)"


def held_out_parts(data: DataArguments, text: RawData, tokenizer: Any) -> dict[str, IndexedExamples] | None:
    """A mixture's held-out part per source, tokenized as training tokenized it (its loss per source)."""
    return {part.key: tokenize(data, raw, tokenizer)["validation"] for part, raw in text.parts or ()} or None


def fetched_model(model: ModelArguments, training: TrainingArguments) -> None:
    """A model or checkpoint in a bucket (``s3://...``, any fsspec URL): downloaded afresh once per node into the
    cache (HF_HOME), verified against its list of files, and evaluated from there (``model`` then names it)."""
    url = model.model_name_or_path
    if not is_store_url(url):
        return
    local = cache_root() / "models" / hashlib.sha256(url.encode()).hexdigest()[:CACHE_KEY_CHARS]
    with training.main_process_first(local=True, desc="downloading the model"):
        if training.local_process_index == 0:
            shutil.rmtree(local, ignore_errors=True)
            say(fetch(url, local, label=model.source_of("model_name_or_path")))
    model.model_name_or_path = str(local)


def refuse_architecture(model: ModelArguments) -> None:
    """ConfigError when the model option names an architecture to build, not a trained model to score."""
    if model_source(model.model_name_or_path, model.config_overrides).kind == "scratch":
        raise ConfigError(
            f"{model.source_of('model_name_or_path')}={model.model_name_or_path!r}: evaluate needs a trained "
            "model (a final/ directory, a checkpoint-N/ directory or a hub id), not an architecture"
        )


@dataclass(frozen=True)
class Scoring:
    """What evaluate scores, on what: the model as the user named it (``shown``) and as loaded, the head its scores
    went through (``head``: masked-only or dense, train/run/model_setup.py with_head), what its weights lacked of
    the MLM head, its tokenizer and collator; the held-out text, tokenized (a mixture's also per source,
    as training tokenized it), and the dataset option it was held out of."""

    shown: str
    model: Any
    head: str
    head_weights: str | None
    tokenizer: Any
    collator: MaskingCollator
    text: RawData
    validation: IndexedExamples
    parts: dict[str, IndexedExamples] | None
    dataset: str
    data: str  # the data scored, in words (scored_data)


def evaluate(
    scoring: Scoring, training: TrainingArguments, settings: TrainerSettings, log_format: str
) -> dict[str, Any]:
    """Every rank: the model scored on the held-out text, masked at the evaluation rate (``settings``: the
    evaluation's masking and a mixture's parts, as training's evaluations have them); the figures (the same on
    every rank)."""
    training.report_to = []  # a score, not a run: no tracker run is started (the JSON and the line are the record)
    validation, parts = scoring.validation, scoring.parts
    trainer = MLMTrainer(
        model=scoring.model,
        args=training,
        eval_dataset=validation,
        data_collator=scoring.collator,
        processing_class=scoring.tokenizer,
        compute_metrics=evaluation_metrics(training.eval_batch_size),
        preprocess_logits_for_metrics=argmax_logits,
        settings=settings,
    )
    losses_are_batch_means(trainer)
    trainer.remove_callback(PrinterCallback)
    if not bars_drawn(resolve_format(log_format)):
        trainer.remove_callback(ProgressCallback)
    metrics = trainer.evaluate()
    loss = float(metrics["eval_loss"])
    return {
        "model": scoring.shown,
        "eval_loss": loss,
        "eval_loss_se": metrics.get("eval_loss_se"),  # over its batches (train/run/batches.py loss_standard_error)
        "perplexity": math.exp(loss) if loss < 700 else math.inf,
        "eval_accuracy": metrics.get("eval_accuracy"),
        "eval_samples": len(validation),
        "eval_documents": len(scoring.text.splits["validation"]),
        "eval_mlm_probability": settings.eval_collator.mlm_probability if settings.eval_collator else None,
        "seed": training.seed,
        "world_size": training.world_size,
        "dataset": scoring.dataset,
        "data": scoring.data,
        "dataset_fingerprint": scoring.text.fingerprint,
        "head": scoring.head,
        "head_weights": scoring.head_weights,
        "eval_samples_per_second": metrics.get("eval_samples_per_second"),
        "eval_runtime": metrics.get("eval_runtime"),
        **({"eval_loss_by_source": {key: metrics[f"eval_{key}_loss"] for key in parts}} if parts else {}),
    }


def results_text(results: dict[str, Any]) -> str:
    """The scores in one line for a person."""
    accuracy = results["eval_accuracy"]
    return (
        f"evaluated {results['model']} on {results['eval_samples']:,} held-out samples of {results['data']}: loss "
        f"{results['eval_loss']:.4f}, perplexity {results['perplexity']:.2f}"
        + (f", masked-token accuracy {accuracy:.4f}" if accuracy is not None else "")
        + "".join(f"; {key} loss {loss:.4f}" for key, loss in results.get("eval_loss_by_source", {}).items())
    )


def main(argv: list[str] | None = None) -> int:
    return start("evaluate", evaluated, argv)


def evaluated(config: Config) -> int:
    """Every rank: score the model; world rank 0 says it in one line and writes eval_results.json. It takes the
    whole Config because it assembles the evaluation: the model (model), the held-out text tokenized (data), its
    masking (masking), the Trainer's arguments (training), the console (launch) and where the results go."""
    training = config.training
    shown = config.model.model_name_or_path
    fetched_model(config.model, training)
    refuse_architecture(config.model)
    model_config = check_before_data(config.model, config.data, None)
    with training.main_process_first(desc="preparing the held-out data"):
        text = held_out(load_raw(config.data, training), config.data)
        tokenizer = load_tokenizer(config.model, config.data, text, None)
        parts = held_out_parts(config.data, text, tokenizer)
        validation = joined(parts.values()) if parts else tokenize(config.data, text, tokenizer)["validation"]
    model, head_weights = load_model(config.model, config.data, None, tokenizer, model_config)
    head = with_head(config.model, model, "evaluating")  # the masked positions alone, as training projects them
    collator = masking_collator(config.data, config.masking, config.model, training.seed, tokenizer, model)
    scoring = Scoring(
        shown,
        model,
        head,
        head_weights,
        tokenizer,
        collator,
        text,
        validation,
        parts,
        config.data.dataset,
        scored_data(config.data),
    )
    settings = evaluation_settings(config.masking, config.schedule.decay_ratio, collator, parts)
    log_format = config.launch.log_format
    results = evaluate(scoring, training, settings, log_format)
    write_results(output_location(config), log_format, EVAL_RESULTS, results, "evaluate", results_text(results))
    return 0


if __name__ == "__main__":
    distributed.run_and_exit(main)
