"""What ``finetune`` fine-tunes besides one model: every model of a run (``MLM_TASK_ALL_CHECKPOINTS=true`` with
``MLM_MODEL_NAME_OR_PATH`` the run's output_dir), each verified as a resume verifies it and placed in the run (its
step, the tokens seen, the time since the run's launch), and the pretrained model a run started from.

Where a model stands in its run is read from what the run recorded: a checkpoint's ``trainer_state.json``
(``global_step``, ``num_input_tokens_seen``), final/'s step and tokens from the run's end record in
``logs/train.jsonl``, and the time since the launch from the evaluation the run made at that step (the held-out
loss's point of ``run.json``'s quality_curve, which the log holds too, and holds while the run is still going). A
model saved at a step without an evaluation has no time: evaluate when saving (the default: both each epoch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train.common import distributed
from train.common.console import say
from train.common.errors import ConfigError
from train.common.urls import is_store_url
from train.config import ModelArguments, TaskArguments
from train.config.model_source import model_source
from train.outputs.marker import weights_digest
from train.outputs.runfiles import TRAINER_STATE, RunFiles, is_checkpoint_name
from train.outputs.verify import verify
from train.report import load_run, number, read_record
from train.run.outcome import write_report_safely

ALL_CHECKPOINTS = "task_all_checkpoints"


@dataclass(frozen=True)
class Point:
    """One model of a run and where it stands in it (None: not recorded)."""

    model: str  # checkpoint-N or final
    path: str
    step: int | None
    tokens_seen: int | None
    since_launch_s: float | None
    weights: str | None = None  # the weights' digests as the model's marker lists them: what a rerun reuses by


@dataclass(frozen=True)
class Starting:
    """The pretrained model a run started from, as its run.json names it."""

    name: str
    tokenizer: str | None
    named_by: str  # the run.json it came from, for the lines that name it


def run_directory(model: ModelArguments, task: TaskArguments) -> RunFiles:
    """MLM_MODEL_NAME_OR_PATH as a run's output_dir, holding checkpoint-N/ or final/; ConfigError otherwise."""
    name = model.model_name_or_path
    option = model.source_of("model_name_or_path")
    if is_store_url(name):
        raise ConfigError(
            f"{option}={name!r}: {task.source_of(ALL_CHECKPOINTS)}=true reads a run's output_dir on this "
            "machine; copy the run from its bucket first"
        )
    files = RunFiles(Path(name).expanduser())
    if not files.root.is_dir():
        raise ConfigError(f"{option}={name!r}: no such directory; expected a run's output_dir")
    if not files.checkpoints() and not files.final.is_dir():
        raise ConfigError(f"{option}={name!r}: holds no checkpoint-N/ nor final/; expected a run's output_dir")
    return files


def verified_models(model: ModelArguments, files: RunFiles, warn: Callable[[str], None]) -> list[Path]:
    """The run's checkpoints, oldest first, then final/: each checked as ``verify`` checks it (a checkpoint as a
    resume does); a damaged one is skipped with one line naming it. ConfigError when none is left."""
    candidates = files.checkpoints() + ([files.final] if files.final.is_dir() else [])
    kept = []
    for candidate in candidates:
        try:
            verify(candidate, str(candidate))
        except ConfigError as exc:
            warn(f"skipping {exc}")
            continue
        kept.append(candidate)
    if not kept:
        option = model.source_of("model_name_or_path")
        raise ConfigError(f"{option}={model.model_name_or_path!r}: no intact checkpoint or final model in it")
    return kept


def _count(value: Any) -> int | None:
    """A recorded step or token count; None for anything else (not recorded)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def points(files: RunFiles, models: list[Path]) -> list[Point]:
    """Each model's step, tokens seen and time since the launch, as the run recorded them."""
    try:
        log = load_run(files.root)
        evals, end = {r["step"]: r for r in log.evals}, log.summary
    except ConfigError:  # a run without logs: the checkpoints' own states still say their steps
        evals, end = {}, {}
    found = []
    for model in models:
        if is_checkpoint_name(model.name):
            state = read_record(model / TRAINER_STATE) or {}
            step, tokens = _count(state.get("global_step")), _count(state.get("num_input_tokens_seen"))
        else:
            step, tokens = _count(end.get("step")), _count(end.get("num_input_tokens_seen"))
        evaluation = evals.get(step, {})
        tokens = tokens or _count(evaluation.get("tokens_seen"))
        since = number(evaluation.get("since_launch_s"))
        found.append(Point(model.name, str(model), step, tokens, since, weights_digest(model)))
    return found


def starting_model(run_dir: Path | None, warn: Callable[[str], None]) -> Starting | None:
    """The pretrained model on the hub the run in ``run_dir`` started from (its run.json's model_name_or_path and
    tokenizer_name); None without a run.json, or for a run from scratch (nothing before its pretraining), or (said
    with ``warn``) one a local path names: a run.json is data, and a path in it could lead the read anywhere."""
    if run_dir is None:
        return None
    record = RunFiles(run_dir).run_json
    options = (read_record(record) or {}).get("config")
    if not isinstance(options, dict) or not isinstance(options.get("model_name_or_path"), str):
        return None
    overrides = options.get("config_overrides")
    source = model_source(options["model_name_or_path"], overrides if isinstance(overrides, str) else None)
    if source.kind == "scratch":
        return None
    tokenizer = options.get("tokenizer_name")
    tokenizer = tokenizer if isinstance(tokenizer, str) else None
    if source.kind != "hub" or (tokenizer is not None and model_source(tokenizer, None).kind != "hub"):
        warn(
            f"not scoring the model the run started from: {record} names {source.name!r}, a local path, and a "
            "path read from a run's record is never opened; fine-tune it by naming it yourself"
        )
        return None
    return Starting(source.name, tokenizer, str(record))


def without_remote_code(model: ModelArguments) -> ModelArguments:
    """The model options for a model a file named: trust is never inherited from a file, so its own code never
    runs, whatever MLM_TRUST_REMOTE_CODE says for the model the user named."""
    return model.but(trust_remote_code=False)


def run_of(model: str) -> Path | None:
    """The output_dir a local final/ or checkpoint-N/ sits in (where its run.json is); None for a hub id, or a
    directory that is neither."""
    if is_store_url(model):
        return None
    path = Path(model).expanduser()
    if path.is_dir() and (path.name == "final" or is_checkpoint_name(path.name)):
        return path.resolve().parent
    return None


def refresh_report(output: str, run: str) -> None:
    """The run's report drawn again when the series was written into the run's own output_dir: ``output`` (the
    output_dir option) is ``run`` (the model option); the training job drew it when it ended, without the series."""
    if is_store_url(output) or is_store_url(run):
        return
    if Path(output).expanduser().resolve() == Path(run).expanduser().resolve():
        write_report_safely(RunFiles(Path(output).expanduser()))


# What must be the same for an earlier score of the same weights to stand for a new one.
SAME_SCORING = ("task_files", "recipe", "world_size", "labels", "pair")


@dataclass(frozen=True)
class Earlier:
    """What an earlier ``finetune`` over the same run scored that this one may keep: each model's block by its
    weights' digest, and the blocks of the model the run started from and of the random-init baseline."""

    series: dict[str, dict[str, Any]] = field(default_factory=dict)
    starting: dict[str, Any] | None = None
    baseline: dict[str, Any] | None = None

    def kept(self, kind: str, block: dict[str, Any] | None, model: str) -> dict[str, Any] | None:
        """``block`` when it scored ``model`` (said in one line), else None."""
        if not isinstance(block, dict) or block.get("model") != model or not isinstance(block.get("seeds"), list):
            return None
        if distributed.is_world_zero():
            say(f"finetune {kind} ({model}): scored before (the same task, recipe and ranks): kept")
        return block


def earlier_scores(path: Path, scoring: dict[str, Any]) -> Earlier:
    """The scores of an earlier ``finetune`` over the same run (``scoring["model"]``) written at ``path``: only
    when it scored the same task files with the same recipe on as many ranks (``scoring``: this run's values of
    ``SAME_SCORING``). A rerun while the run goes on then fine-tunes only the models saved since; anything else in
    the file (another run, task or recipe, a file that does not parse) reuses nothing."""
    earlier = read_record(path)
    if not earlier or any(earlier.get(key) != scoring.get(key) for key in (*SAME_SCORING, "model")):
        return Earlier()
    found = {}
    for entry in earlier.get("series") or []:
        if isinstance(entry, dict) and isinstance(entry.get("weights"), str) and isinstance(entry.get("seeds"), list):
            found[entry["weights"]] = {key: entry[key] for key in entry if key not in Point.__dataclass_fields__}
    return Earlier(found, earlier.get("starting"), earlier.get("baseline"))


def score_series(
    located: list[Point], subjects: list[Any], earlier: dict[str, dict[str, Any]], score: Callable[..., tuple]
) -> tuple[list[dict[str, Any]], list[str] | None]:
    """Each model of the run scored in order (``score(subject, label)``: its block of seeds and scores, and the
    weights a classifier added), or its earlier score kept when :func:`earlier_scores` has one for its weights
    (said in one line); the series, and the weights the last fine-tuned classifier added (None: none was)."""
    entries, new = [], None
    for point, subject in zip(located, subjects, strict=True):
        block = earlier.get(point.weights) if point.weights else None
        if block is None:
            block, new = score(subject, point.model)
        elif distributed.is_world_zero():
            say(f"finetune {point.model}: scored before (the same weights, task, recipe and ranks): kept")
        entries.append({**dataclasses.asdict(point), **block})
    return entries, new
