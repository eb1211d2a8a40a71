"""From the resolved configuration to a ready Trainer: the data (a Corpus), the tokenizer, the model, the
collator and the callbacks, as one typed :class:`Prepared`. The parsed configuration is not changed: what the
Trainer must run with differently (a stream's arguments) goes to a copy of its arguments."""

from __future__ import annotations

import contextlib
import copy
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
from transformers import TrainingArguments

from train.borrowed.transformers_models import attn_implementation
from train.common import distributed
from train.common.console import say
from train.common.handoff import Handoff
from train.common.hf import cache_root
from train.common.phase import PhaseFacts
from train.config import Config, DataArguments, ModelArguments
from train.data import (
    Corpus,
    Padding,
    RawData,
    StreamPosition,
    build_corpus,
    check_stream_parts,
    load_raw,
    stream_training_overrides,
)
from train.data.mixture import as_record
from train.model.collator import MaskingCollator
from train.model.companions import check_companions, companion_directory, keep_sentence_transformers
from train.model.load import (
    attention_implementation,
    check_before_data,
    load_tokenizer,
    scratch_config,
    settle_tokenizer,
    trains_its_tokenizer,
)
from train.model.tokenizer_training import agree_on_tokenizer
from train.outputs.branch import BranchPoint
from train.outputs.checkpoints import saved_world_size
from train.outputs.facts import Masking, ModelFacts, Packing, RunFacts, Sharding
from train.outputs.runfiles import RunFiles
from train.run.adapting import check_adapting, drift_batch, head_training
from train.run.batches import (
    argmax_logits,
    batch_facts,
    batch_warmup,
    check_batch_warmup,
    check_isolation,
    evaluation_metrics,
    masking_collator,
)
from train.run.branching import BranchLearningRate, PhaseEnd, learning_rate_ratio
from train.run.budget import TimeBudget
from train.run.budget_evaluation import EvaluationSizer
from train.run.callbacks import CheckpointCompleteMarker, DivergenceGuard, EpochForCollator
from train.run.diagnostics import TokenFlops, rank_peak
from train.run.model_setup import Blueprint, set_up_model, shard_for_training
from train.run.preemption import StopOnSignal
from train.run.progress import ProgressReport, progress_report
from train.run.resuming import ResumePoint, resume_point
from train.run.rollback import rollback_unavailable
from train.run.saving import CheckpointWriter, background_saves, sync_reason
from train.run.sharding import ShardedTrainer, StateBytes, check_sharding, sharding_facts
from train.run.startup import Startup
from train.run.trainer import MLMTrainer, losses_are_batch_means
from train.run.trainer_settings import HeadTraining, TrainerSettings, evaluation_collator, mask_rates, resumed_stream


@dataclass(frozen=True)
class Prepared:
    """Everything a rank trains with."""

    trainer: MLMTrainer
    tokenizer: Any
    corpus: Corpus
    stopper: StopOnSignal  # the stop signals' agreement (train/run/preemption.py)
    guard: DivergenceGuard  # a non-finite loss, gradient or weight stops the run
    head: str  # "masked-only" (train/model/head.py) or "dense"
    head_weights: str | None  # what the pretrained weights lacked of the head (train/model/weights.py), or None
    companions: Path | None  # a pretrained model's files beside its encoder (train/model/companions.py)
    masking: Masking  # the configured rates and the realised one (:func:`batch_facts`)
    packing: Packing  # the padding mode and its efficiency (:func:`batch_facts`)
    resume: str | None = None  # the checkpoint this rank resumes from (its node's copy)
    budget: TimeBudget | None = None  # the steps planned to a deadline (train/run/budget.py), with time_budget
    sharding: str = "ddp"  # the mode it trains with: ddp or fsdp (MLM_SHARDING, auto decided: train/run/sharding.py)
    sharding_choice: str = ""  # the mode and why, with DDP's memory estimate
    ddp_estimate: dict[str, int] | None = None  # that estimate (train/model/memory.py), as plan shows it
    state_bytes: StateBytes | None = None  # this rank's measured parameters, gradients and optimizer state
    setup_bytes: int | None = None  # its growth in resident memory while its model was set up (model_setup.py)
    data_identity: dict[str, Any] | None = None  # what identifies the data as read (train/data/identity.py)
    data_changed: list[str] | None = None  # what changed since the resumed checkpoint, when told to go on anyway
    branch: BranchPoint | None = None  # where the run branched from, when it is a branch (train/outputs/branch.py)
    phase: PhaseFacts | None = None  # the phase this launch trains, in a phased run (train/launch/phases.py)
    batch_warmup: dict[str, Any] | None = None  # a growing global batch's facts (BatchWarmup.record)
    progress: ProgressReport | None = None  # this rank's progress, where a launcher watches (train/run/progress.py)

    def write_model(self, directory: Path) -> None:
        """The trained model and its tokenizer, as AutoModelForMaskedLM / AutoTokenizer load them, and a
        sentence-transformers model's modules around it."""
        self.trainer.save_model(str(directory))
        settle_tokenizer(self.tokenizer)
        self.tokenizer.save_pretrained(str(directory))
        kept = keep_sentence_transformers(self.companions, directory)
        if kept:
            say(kept)

    def facts(self, outputs: str | None = None) -> RunFacts:
        """What the banner, the logs and run.json say about the data and the model; ``outputs``: where the outputs
        live, in words (the output location's summary)."""
        corpus = self.corpus
        return RunFacts(
            dataset_fingerprint=corpus.fingerprint,
            data_identity=self.data_identity,
            resumed_on_changed_data=self.data_changed,
            train_samples=corpus.train_samples,
            eval_samples=corpus.eval_samples,
            train_documents=corpus.train_documents,
            eval_documents=corpus.eval_documents,
            train_real_tokens=corpus.train_real_tokens,
            truncation=corpus.truncation,
            # what ran: transformers' choice (or MLM_ATTN_IMPLEMENTATION), and the head the loss went through
            model=ModelFacts(
                attention=attn_implementation(self.trainer.model.config),
                head=self.head,
                head_weights=self.head_weights,
            ),
            masking=self.masking,
            packing=self.packing,
            resumed_from_ranks=saved_world_size(Path(self.resume)) if self.resume else None,
            sharding=Sharding(mode=self.sharding, choice=self.sharding_choice, ddp_estimate=self.ddp_estimate),
            outputs=outputs,
            mixture=as_record(corpus.mixture) if corpus.mixture else None,
            branch=self.branch.as_record() if self.branch else None,
            phase=self.phase.record() if self.phase else None,
            batch_warmup=self.batch_warmup,
        )

    def sharding_facts(self) -> dict[str, Any]:
        """The mode and every rank's measured bytes (a collective: every rank calls it, at the end)."""
        return {
            **sharding_facts(self.sharding, self.state_bytes or StateBytes(), self.setup_bytes),
            "choice": self.sharding_choice,
            "ddp_estimate": self.ddp_estimate,
        }


def prepare(
    config: Config,
    files: RunFiles,
    choose_resume: Callable[[], str | None] = lambda: None,
    startup: Startup | None = None,
) -> Prepared:
    """Data, tokenizer, model, collator and Trainer for this rank, and the checkpoint it resumes from.

    ``choose_resume`` (every rank calls it: train/run/job.py's agreement) runs once the options, the model's config
    and the data have been checked, so that bad input leaves output_dir as it was, and before the tokenizer: a
    resumed run tokenizes with its checkpoint's.

    Rank 0 reads the data, trains a tokenizer if one is needed and tokenizes; the other ranks then load the same
    results from the caches instead of repeating the work: each node's local rank 0 does it for its node, unless
    the nodes share the cache, where world rank 0 does it for all. A trained tokenizer is world rank 0's on every
    node (and a resumed run's is its checkpoint's): train/model/tokenizer_training.py says why.

    ``startup`` gets each phase's end (train/run/startup.py). It takes the whole Config: it assembles the rank."""
    training = config.training
    mark = startup.mark if startup is not None else lambda phase, note=None: None
    stopper = StopOnSignal()  # first: a stop while the data is prepared (or a checkpoint downloads) is exit 75
    checked = check_before_reading(config)
    shared = cache_shared_with_rank_0(training)
    mark("checks")
    with training.main_process_first(local=not shared, desc="preparing data"):
        raw = load_raw(config.data, training)
        mark("reading data")
        tokenizer = named_tokenizer(config.model, config.data, raw, checked.arch)  # a named one: checked before resume
    mark("tokenizer")
    point = resume_point(config, files, choose_resume(), raw.identity)
    mark("resume")
    if tokenizer is None:  # trained: the checkpoint's when resuming, world rank 0's on every node
        with training.main_process_first(local=not shared, desc="training the tokenizer"):
            tokenizer = load_tokenizer(config.model, config.data, raw, checked.arch, point.resume)
        tokenizer = agree_on_tokenizer(tokenizer)
        mark("tokenizer")
    with training.main_process_first(local=not shared, desc="tokenizing"):
        corpus = build_corpus(config.data, raw, tokenizer, training.process_index, training.world_size, training.seed)
    check_stream_parts(config.data, corpus)  # a collective: after main_process_first, where every rank has its part
    mark("tokenizing", {None: "streamed", True: "cached", False: "not cached"}[corpus.cached])
    resume = Path(point.resume) if point.resume else None
    blueprint = Blueprint(checked.arch, tokenizer, checked.model_config, resume)
    built = set_up_model(config.model, config.data, config.adapting, config.launch, training, blueprint)
    # the collator prepares the model when documents are kept apart
    collator = masking_collator(config.data, config.masking, config.model, training.seed, tokenizer, built.model)
    held_out = corpus.validation if corpus.validation is not None and training.eval_strategy != "no" else None
    budget = time_budget(
        built.model, held_out, stopper, training, config.schedule.decay_ratio, config.launch.stop_timeout
    )
    model = shard_for_training(built, training)
    mark("model")
    reason = sync_reason(built.sharding, config.output_store, training.load_best_model_at_end, budget is not None)
    saves = background_saves(config.checkpoint, reason)
    progress = progress_report()
    marker = CheckpointCompleteMarker.of(config, files, raw.identity, point.phase, saves, progress)
    scratch = checked.arch is not None
    model_settings = ModelSettings(
        head=head_training(config.adapting, model, scratch, built.head_weights is not None),
        drift=drift_batch(model, held_out, tokenizer.pad_token_id, scratch),
        flops=TokenFlops.of(built.model, built.head == "masked-only"),
    )
    settings = settings_for(config, corpus, collator, point, model_settings, saves)
    state_bytes = StateBytes()
    trainer = (ShardedTrainer if built.sharding == "fsdp" else MLMTrainer)(
        model=model,
        args=trainer_arguments(training, corpus),
        train_dataset=corpus.train,
        eval_dataset=corpus.validation,
        data_collator=collator,
        processing_class=tokenizer,
        compute_metrics=evaluation_metrics(training.eval_batch_size) if held_out is not None else None,
        preprocess_logits_for_metrics=argmax_logits if held_out is not None else None,
        callbacks=[*trainer_callbacks(config, marker, collator, corpus, point), state_bytes],
        settings=settings,
    )
    if budget is not None:
        budget.size_evaluation = EvaluationSizer(trainer)
        budget.batch_warmup = settings.batch_warmup
    losses_are_batch_means(trainer)
    masking, packing_facts = batch_facts(config.masking, config.data, training, collator, corpus)
    warmup = settings.batch_warmup  # in tokens too where every row is a packed block of max_seq_length
    packs = Padding(config.data.padding).packs
    warmup_facts = warmup.record(config.data.max_seq_length if packs else None) if warmup else None
    unavailable = rollback_unavailable(corpus.streaming, built.sharding, config.output_store)
    guard = DivergenceGuard.of(config.resilience, unavailable, training.max_grad_norm)
    mark("trainer")
    return Prepared(
        trainer=trainer, tokenizer=tokenizer, corpus=corpus, stopper=stopper, guard=guard,
        head=built.head, head_weights=built.head_weights, masking=masking, packing=packing_facts,
        resume=point.resume, budget=budget, sharding=built.sharding, sharding_choice=built.choice,
        ddp_estimate=built.estimate, state_bytes=state_bytes, setup_bytes=built.setup_bytes,
        data_identity=raw.identity, data_changed=point.data_changed, companions=checked.companions,
        branch=point.recorded_branch, phase=point.phase, batch_warmup=warmup_facts, progress=progress,
    )  # fmt: skip


@dataclass(frozen=True)
class Checked:
    """What the checks before any data found (:func:`check_before_reading`)."""

    arch: Any | None  # the architecture trained from scratch (train/model/load.py scratch_config), or None
    model_config: Any | None  # a pretrained model's config, checked before the data, or None
    companions: Path | None  # a pretrained model's files beside its encoder (train/model/companions.py), or None


def check_before_reading(config: Config) -> Checked:
    """Every check that needs no data, before any is read, so that bad input costs seconds and leaves output_dir
    as it was: the sharding, batch warm-up and adapting options, the model's config and weights, a handed-over
    model's companion files, and documents kept apart where the config says the attention cannot."""
    check_sharding(config.launch, config.training, config.adapting)
    check_batch_warmup(config.schedule, config.data)
    arch = scratch_config(config.model)
    check_adapting(config.adapting, config.model, scratch=arch is not None)
    model_config = check_before_data(config.model, config.data, arch)
    companions = None if arch is not None else companion_directory(config.model.model_name_or_path)
    check_companions(companions)  # a handed-over model's files final/ will keep: checked before the data
    if model_config is not None and Padding(config.data.padding).isolates:  # where the config is known
        check_isolation(config.data, model_config, attention_implementation(config.model, model_config))
    return Checked(arch, model_config, companions)


def named_tokenizer(model: ModelArguments, data: DataArguments, raw: RawData, arch: Any | None) -> Any | None:
    """The tokenizer the options name (or the pretrained model's), loaded; None where the run trains its own,
    which waits for the resume point (a resumed run's is its checkpoint's)."""
    if trains_its_tokenizer(model, arch):
        return None
    return load_tokenizer(model, data, raw, arch)


@dataclass(frozen=True)
class ModelSettings:
    """What the Trainer's settings take from the model: how its head trains (train/run/adapting.py), the held-out
    rows its encoder's drift is measured on (None: not measured), the sizes its steps' FLOPs are counted from
    (train/run/diagnostics.py; None: no MFU)."""

    head: HeadTraining
    drift: dict[str, Any] | None
    flops: TokenFlops | None


def settings_for(
    config: Config,
    corpus: Corpus,
    collator: MaskingCollator,
    point: ResumePoint,
    model: ModelSettings,
    saves: CheckpointWriter | None,
) -> TrainerSettings:
    """The Trainer's settings (train/run/trainer_settings.py) for this rank's corpus, collator, resume point, model
    and checkpoint writer (train/run/saving.py); the MFU against this rank's device's peak."""
    training = config.training
    position, stream_part = resumed_stream(training, config.data, corpus, point.resume)
    return TrainerSettings(
        eval_collator=evaluation_collator(config.masking, collator),
        eval_parts=corpus.validation_parts,
        decay_ratio=config.schedule.decay_ratio,
        mask_rates=mask_rates(config.masking),
        batch_warmup=batch_warmup(config.schedule, training),
        phase=point.phase,
        head=model.head,
        drift_batch=model.drift,
        stream_position=position,
        stream_part=stream_part,
        token_flops=model.flops,
        peak=rank_peak(training, Handoff.from_environ()),
        saves=saves,
    )


def trainer_callbacks(
    config: Config, marker: CheckpointCompleteMarker, collator: MaskingCollator, corpus: Corpus, point: ResumePoint
) -> list[Any]:
    """The job's own callbacks on the Trainer: the collator's epoch, a stream's positions, the checkpoint's
    completeness ``marker``, a branch's learning rate and a phase's end. StreamPosition before the marker: a
    checkpoint is complete once the streams' positions are in it."""
    return [
        EpochForCollator(collator),
        *([StreamPosition()] if corpus.streaming else []),
        marker,
        BranchLearningRate(learning_rate_ratio(config.training.learning_rate, point.branch)),
        *([PhaseEnd(point.phase)] if point.phase else []),
    ]


def time_budget(
    model: Any, held_out: Any, stopper: StopOnSignal, training: TrainingArguments, decay_ratio: float, stop_timeout: int
) -> TimeBudget | None:
    """The budget's planner, when the launcher handed over a deadline: with the evaluation's batches per rank and
    a checkpoint's size (weights and AdamW's two moments), its estimates until an evaluation and a save are timed."""
    handoff = Handoff.from_environ()
    if handoff is None or not handoff.budgeted:
        return None
    per_pass = training.per_device_eval_batch_size * max(training.world_size, 1)
    batches = -(-len(held_out) // per_pass) if held_out is not None else 0
    weights_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
    return TimeBudget(handoff, batches, 3 * weights_mb, decay_ratio, stopper, stop_timeout)


def trainer_arguments(training: TrainingArguments, corpus: Corpus) -> TrainingArguments:
    """The Trainer's arguments for this corpus: a copy of the parsed ones without save_total_limit (the job rotates
    checkpoints, after each marker: train/outputs/retention.py), and for a stream with what it needs."""
    changed = copy.copy(training)  # shallow: the process group and device the parsed arguments set up stay shared
    changed.save_total_limit = None
    for name, value in (stream_training_overrides() if corpus.streaming else {}).items():
        setattr(changed, name, value)
    return changed


def cache_shared_with_rank_0(training: TrainingArguments) -> bool:
    """Whether this rank's cache (cache_root, in HF_HOME) is world rank 0's, on a node of its own: one volume the
    nodes share (NFS, a Slurm cluster's home), found by looking. Rank 0 writes a file under a fresh random name
    and broadcasts the name; each rank looks for it; then rank 0 removes it.

    Why: transformers' main_process_first lets each node's local rank 0 do the work (right for node-local caches);
    on a shared cache every node would tokenize into the same files at once (the work once per node, and on NFS a
    file replaced while another node reads it goes stale). Neither transformers nor datasets tells them apart. A
    name that is not seen (a client's stale directory cache) only means the node does the work itself, as before.
    Only a volume shared with node 0 is found: nodes 1 and 2 sharing one that node 0 has not each do the work.
    """
    rank, local_rank = training.process_index, training.local_process_index
    # torchrun's: the Trainer's arguments know the world and this rank's place on its node, not the node's size.
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(training.world_size)))
    if training.world_size == local_world or not distributed.initialized():
        return False  # one node: its local rank 0 is world rank 0 either way
    cache = cache_root()
    name: list[str | None] = [None]
    if rank == 0:
        try:
            cache.mkdir(parents=True, exist_ok=True)
            (cache / (probe := f".shared-{uuid.uuid4().hex}")).touch()
            name[0] = probe
        except OSError:  # the other ranks wait in the broadcast: send them "no", and let tokenizing say what failed
            pass
    dist.broadcast_object_list(name, src=0)  # sent once the file exists
    shared = name[0] is not None and (cache / name[0]).exists()
    dist.barrier()
    if rank == 0 and name[0] is not None:
        with contextlib.suppress(OSError):
            (cache / name[0]).unlink(missing_ok=True)
    if shared and local_rank == 0 and rank != 0:  # each other node's local rank 0 says so once
        say(f"the cache {cache} is node 0's too (a shared volume): node 0 prepares the data, this node reads it")
    return shared
