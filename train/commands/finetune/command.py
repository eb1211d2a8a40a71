"""``./entrypoint.sh finetune --task DIR|glue:NAME [--option value ...]`` (under torchrun, as training): a trained
model or a checkpoint (``MLM_MODEL_NAME_OR_PATH``: a directory, a hub id, or either in a bucket) fine-tuned on a
labelled sequence-classification task (train/data/tasks.py; GLUE's by name, train/data/glue.py) and scored on its
test split. A masked-LM loss says how well a model fills in blanks; a downstream score says whether it helps.

One fixed recipe for every task (Cramming's way, Geiping & Goldstein 2023: one set of fine-tuning settings for all
of GLUE, so that scores compare models, not tuning effort); its values are ELECTRA's fine-tuning defaults
(configure_finetuning.py: learning rate 1e-4, batch 32, 3 epochs, 10 % warm-up then linear decay, weight decay
0.01), without its layer-wise decay. Only the learning rate and the epochs are options. The fine-tuning is run
with seeds 0..n-1 (``task_seeds``); the score is the mean and standard deviation over them, since one seed of a
small task can move accuracy by points. ``task_baselines`` adds the same recipe on a randomly initialised model
of the same architecture: what pretraining added; a model from a run that started from a pretrained model (its
run.json says) has that model scored too ("before pretraining"). ``task_all_checkpoints``: every checkpoint and
the final model of a run, for a series against its steps, tokens and time (train/commands/finetune/series.py).

World rank 0 prints one line per seed and one for the score (JSON with ``MLM_LOG_FORMAT=json``) and writes
``finetune_results.json`` where the outputs live: plain ``transformers.Trainer``, nothing of the MLM job's.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    set_seed,
)
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from train.commands.evaluate import fetched_model
from train.commands.finetune import series
from train.commands.finetune.recipe import Machine, Recipe, arguments, recipe_for
from train.commands.finetune.scores import classification_scores, results_text, scores_text, summary
from train.commands.finetune.series import Point, run_of, starting_model, without_remote_code
from train.commands.results import write_results
from train.commands.start import start
from train.common import distributed
from train.common.console import resolve_format, say
from train.common.errors import ConfigError, first_line
from train.config import Config, ModelArguments, TaskArguments
from train.config.model_source import model_source
from train.data.tasks import PAIR, TEXT, Task, load_task
from train.model.load import quiet_transformers, refuse_unsafe_weights
from train.outputs.location import output_location
from train.outputs.runfiles import FINETUNE_RESULTS, RunFiles
from train.run.logs import bars_drawn
from train.run.trainer import losses_are_batch_means


@dataclass(frozen=True)
class Subject:
    """What is fine-tuned: the model's name (as loaded), its config with the task's labels, its tokenizer, the
    task tokenized and the recipe."""

    name: str
    model_config: Any
    tokenizer: Any
    train: Dataset
    test: Dataset
    recipe: Recipe
    positive: int | None = None  # the class a GLUE task's F1 is of (Task.positive)


@dataclass(frozen=True)
class Named:
    """A model to fine-tune: its name as loaded, what named it (an option, or a run.json: the errors say it) and
    the tokenizer's name when it is not the model's own."""

    name: str
    option: str
    tokenizer: str | None = None
    tokenizer_option: str = ""


def load_tokenizer(model: ModelArguments, named: Named) -> Any:
    """The named tokenizer (MLM_TOKENIZER_NAME), else the model's (a final/ or checkpoint-N/ directory holds its
    own); its code runs only where ``model`` trusts remote code."""
    name, option = (named.tokenizer, named.tokenizer_option) if named.tokenizer else (named.name, named.option)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=model.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{option}={name!r}: cannot load the tokenizer ({first_line(exc)})") from None
    if tokenizer.pad_token is None:
        raise ConfigError(f"{option}={name!r}: the tokenizer has no padding token; batches of texts need one")
    return tokenizer


def load_model_config(model: ModelArguments, task: Task, named: Named) -> Any:
    """The named model's config with the task's labels: the classification head is built from it."""
    source = model_source(named.name, model.config_overrides)
    if source.kind == "scratch":
        raise ConfigError(
            f"{named.option}={named.name!r}: finetune needs a trained model (a final/ directory, a "
            "checkpoint-N/ directory or a hub id), not an architecture"
        )
    if source.kind == "local":
        if not Path(named.name).expanduser().is_dir():
            raise ConfigError(f"{named.option}={named.name!r}: no such model directory")
        refuse_unsafe_weights(model, Path(named.name).expanduser())
    try:
        return AutoConfig.from_pretrained(
            named.name,
            num_labels=task.num_labels,
            id2label=dict(enumerate(task.labels)),
            label2id={label: i for i, label in enumerate(task.labels)},
            trust_remote_code=model.trust_remote_code,
        )
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{named.option}={named.name!r}: cannot load the model ({first_line(exc)})") from None


def longest(max_seq_length: int, model_config: Any, tokenizer: Any) -> int:
    """max_seq_length, unless the model's positions or its tokenizer's stated limit are shorter."""
    limits = [max_seq_length, getattr(model_config, "max_position_embeddings", None)]
    if tokenizer.model_max_length < 1_000_000:  # unset, transformers says 1e30
        limits.append(tokenizer.model_max_length)
    return min(limit for limit in limits if limit)


def tokenized(task_split: Dataset, tokenizer: Any, max_length: int) -> Dataset:
    """A split as the model reads it: token ids (pairs as the tokenizer joins them, the longer text cut first)
    and the label ids."""
    pair = PAIR in task_split.column_names

    def encode(batch: dict[str, list[Any]]) -> dict[str, Any]:
        return tokenizer(batch[TEXT], batch[PAIR] if pair else None, truncation=True, max_length=max_length)

    return task_split.map(encode, batched=True, remove_columns=[TEXT, PAIR] if pair else [TEXT])


def tokenized_splits(task: Task, tokenizer: Any, max_length: int, done: dict) -> tuple[Dataset, Dataset]:
    """Both splits tokenized, once per tokenizer (``done``: those tokenized so far, by what the token ids depend
    on): a run's checkpoints carry copies of one tokenizer, and a large task (MNLI: 393,000 pairs) would otherwise be
    tokenized again for each of them. A tokenizer without a backend to compare by is not shared."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    key = None if backend is None else (type(tokenizer).__name__, backend.to_str(), tuple(tokenizer.model_input_names))
    if key is None or (key, max_length) not in done:
        splits = (tokenized(task.train, tokenizer, max_length), tokenized(task.test, tokenizer, max_length))
        if key is None:
            return splits
        done[key, max_length] = splits
    return done[key, max_length]


def subject_of(model: ModelArguments, task: Task, named: Named, recipe: Recipe, done: dict | None = None) -> Subject:
    """A named model's config (with the task's labels) and tokenizer, loaded as ``model`` says, the splits
    tokenized for it (``done``: shared between the models of one finetune, :func:`tokenized_splits`), and the
    recipe, its max_length cut to the model's (:func:`longest`)."""
    model_config = load_model_config(model, task, named)
    tokenizer = load_tokenizer(model, named)
    recipe = replace(recipe, max_length=longest(recipe.max_length, model_config, tokenizer))
    train, test = tokenized_splits(task, tokenizer, recipe.max_length, {} if done is None else done)
    return Subject(
        name=named.name,
        model_config=model_config,
        tokenizer=tokenizer,
        train=train,
        test=test,
        recipe=recipe,
        positive=task.positive,
    )


@dataclass(frozen=True)
class Plan:
    """Everything finetune trains, read and checked before the first step: the model (or each model of a run,
    oldest first, with where it stands in the run) and the pretrained model the run started from."""

    task: Task
    subjects: list[Subject]
    points: list[Point] | None  # with MLM_TASK_ALL_CHECKPOINTS, one per subject
    starting: Subject | None


def prepare(task: Task, model: ModelArguments, options: TaskArguments, recipe: Recipe, machine: Machine) -> Plan:
    """Every rank, once ``task`` is read and checked: each model's config and tokenizer (the model options' model,
    or with ``options``' task_all_checkpoints each of the run's), the splits tokenized; every ConfigError after the
    task's comes from here, before anything is trained."""
    option, tokenizer_option = model.source_of("model_name_or_path"), model.source_of("tokenizer_name")
    located, run_dir = None, None
    if options.task_all_checkpoints:
        files = series.run_directory(model, options)
        models = series.verified_models(model, files, lambda text: warned(machine.log_format, text))
        located, run_dir = series.points(files, models), files.root
        names = [str(path) for path in models]
    else:
        fetched_model(model, machine.training)
        names, run_dir = [model.model_name_or_path], run_of(model.model_name_or_path)
    done: dict = {}
    subjects = [
        subject_of(model, task, Named(n, option, model.tokenizer_name, tokenizer_option), recipe, done) for n in names
    ]
    return Plan(task, subjects, located, starting_subject(model, task, run_dir, recipe, done, machine.log_format))


def starting_subject(
    model: ModelArguments, task: Task, run_dir: Path | None, recipe: Recipe, done: dict, log_format: str
) -> Subject | None:
    """The model the run started from, ready to fine-tune (its own code never run); None for a run from scratch,
    and (said in one line) when it cannot be loaded here: the score of the run's own models does not depend on it."""
    starting = starting_model(run_dir, lambda text: warned(log_format, text))
    if starting is None:
        return None
    by = f"{starting.named_by}: model_name_or_path"
    named = Named(starting.name, by, starting.tokenizer, f"{starting.named_by}: tokenizer_name")
    try:
        return subject_of(without_remote_code(model), task, named, recipe, done)
    except ConfigError as exc:
        warned(log_format, f"not scoring the model the run started from ({exc})")
        return None


def classifier(model: ModelArguments, subject: Subject, pretrained: bool) -> tuple[Any, list[str]]:
    """The model with a new classification head: the pretrained weights (and the names of the tensors they lack,
    the head's among them, which start random), or all of it random (a baseline)."""
    trust = model.trust_remote_code
    with quiet_transformers():  # its "newly initialized" report is for a person fine-tuning by hand; ours says it
        if not pretrained:
            return AutoModelForSequenceClassification.from_config(subject.model_config, trust_remote_code=trust), []
        try:
            network, loading = AutoModelForSequenceClassification.from_pretrained(
                subject.name, config=subject.model_config, trust_remote_code=trust, output_loading_info=True
            )
        except (OSError, ValueError) as exc:
            option = model.source_of("model_name_or_path")
            raise ConfigError(f"{option}={subject.name!r}: no classifier from it ({first_line(exc)})") from None
    return network, sorted(loading["missing_keys"])


def fine_tune(
    model: ModelArguments, machine: Machine, subject: Subject, seed: int, pretrained: bool
) -> tuple[dict[str, Any], list[str]]:
    """One seed of the recipe, trained on this machine then scored on the test split; the scores and the newly
    initialised tensors."""
    set_seed(seed)  # the head's initialisation (and a baseline's every weight) is the seed's
    network, new = classifier(model, subject, pretrained)
    trainer = Trainer(
        model=network,
        args=arguments(machine, subject.recipe, seed),
        train_dataset=subject.train,
        data_collator=DataCollatorWithPadding(subject.tokenizer, pad_to_multiple_of=machine.pad_to_multiple_of),
        processing_class=subject.tokenizer,
    )
    # A classifier's loss is a mean over its micro-batch, as the MLM heads' are: without this the Trainer scales it
    # by the world size (2 ranks: a logged loss and gradient twice as large).
    losses_are_batch_means(trainer)
    trainer.remove_callback(PrinterCallback)
    if not bars_drawn(resolve_format(machine.log_format)):
        trainer.remove_callback(ProgressCallback)
    started = time.monotonic()
    trained = trainer.train()
    predicted = trainer.predict(subject.test)
    logits = predicted.predictions[0] if isinstance(predicted.predictions, tuple) else predicted.predictions
    labels = subject.model_config.num_labels
    scores = classification_scores(np.argmax(logits, axis=-1), predicted.label_ids, labels, subject.positive)
    run = {"seed": seed, **scores, "train_loss": trained.training_loss, "seconds": time.monotonic() - started}
    return run, new


def scored(
    model: ModelArguments, machine: Machine, subject: Subject, kind: str, label: str, pretrained: bool
) -> tuple[dict, list[str]]:
    """Every seed of the recipe on one model, each said in a line; the seeds' scores with their mean and spread,
    and the tensors that started random."""
    runs: list[dict] = []
    new: list[str] = []
    for seed in subject.recipe.seeds:
        run, new = fine_tune(model, machine, subject, seed, pretrained)
        runs.append(run)
        record = {"event": "finetune_seed", "kind": kind, "model": subject.name, **run}
        said(machine.log_format, record, f"{label} seed {seed}: {scores_text(run)}")
    return {"seeds": runs, **summary(runs)}, new


def finetune(
    task: Task, model: ModelArguments, options: TaskArguments, recipe: Recipe, machine: Machine
) -> dict[str, Any]:
    """Every rank: every seed of the recipe on the model or on each model of a run (and on the model the run
    started from, and on the baseline), fine-tuned on ``task``; the results (the same on every rank) but their
    wall time, which the command times from before the task is read."""
    shown = model.model_name_or_path
    plan = prepare(task, model, options, recipe, machine)
    newest = plan.subjects[-1]
    results: dict[str, Any] = {
        "task": task.path,
        "task_files": task.files,
        "model": shown,
        "labels": list(task.labels),
        "pair": task.pair,
        "train_examples": len(task.train),
        "test_examples": len(task.test),
        "recipe": asdict(newest.recipe),
        **({"glue": task.glue.record()} if task.glue else {}),
        "world_size": machine.training.world_size,
    }
    earlier = series.Earlier()
    if plan.points is None:
        results["pretrained"], results["new_weights"] = scored(model, machine, newest, "pretrained", "pretrained", True)
    else:
        earlier = series.earlier_scores(RunFiles(machine.training.output_dir).finetune_results, results)
        results["series"], new = series.score_series(
            plan.points,
            plan.subjects,
            earlier.series,
            lambda subject, label: scored(model, machine, subject, "pretrained", label, True),
        )
        results["new_weights"] = new
    if plan.starting is not None:
        starting = plan.starting
        results["starting"] = earlier.kept("before pretraining", earlier.starting, starting.name) or {
            "model": starting.name,
            "max_length": starting.recipe.max_length,
            **scored(model, machine, starting, "starting", "before pretraining", True)[0],
        }
    if options.task_baselines:  # a run's models share one architecture: its random initialisation, seed by seed
        results["baseline"] = earlier.kept("random-init baseline", earlier.baseline, shown) or {
            "model": shown,
            **scored(model, machine, newest, "baseline", "baseline", False)[0],
        }
    return results


def said(log_format: str, record: dict[str, Any], text: str, level: str = "info") -> None:
    """World rank 0's line in ``log_format``: a JSON record, or ``mlm-trainer: finetune ...`` for a person."""
    if not distributed.is_world_zero():
        return
    if resolve_format(log_format) == "json":
        print(json.dumps(record), flush=True)
    else:
        say(f"finetune {text}", level)


def warned(log_format: str, text: str) -> None:
    said(log_format, {"event": "finetune_warning", "level": "warning", "message": text}, text, "warning")


def main(argv: list[str] | None = None) -> int:
    """``python -m train.commands.finetune`` (train/commands/finetune/__main__.py) under torchrun."""
    return start("finetune", finetuned, argv)


def finetuned(config: Config) -> int:
    """Fine-tune and score, write finetune_results.json (world rank 0), and draw a series into the run's report.
    It takes the whole Config because it assembles finetune: the task (task), the model (model), the recipe
    (task, data, training), how every seed trains here (training, data, launch) and where the results go."""
    started = time.monotonic()
    with config.training.main_process_first(desc="reading the task"):
        task = load_task(config.task)
    recipe = recipe_for(config.task, config.data.max_seq_length, config.training.world_size)
    machine = Machine(config.training, config.data.pad_to_multiple_of, config.launch.log_format)
    results = finetune(task, config.model, config.task, recipe, machine)
    results["wall_time_s"] = time.monotonic() - started
    location = output_location(config)
    write_results(location, machine.log_format, FINETUNE_RESULTS, results, "finetune", results_text(results))
    if config.task.task_all_checkpoints and distributed.is_world_zero():
        # drawn beside the held-out loss when written into the run's directory
        series.refresh_report(config.training.output_dir, config.model.model_name_or_path)
    return 0
