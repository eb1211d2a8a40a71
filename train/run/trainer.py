"""The Hugging Face Trainer as the job uses it: one subclass (streamed and resumed loaders, evaluation's own masking,
the scheduler's decay ratio, a mask rate schedule, a batch warm-up, packed batches' token count, tied weights on
resume) and the helpers the job calls on it. Whatever of it reaches into a private API of transformers or torch lives in
train/borrowed/ (the private methods overridden: :class:`~train.borrowed.transformers_trainer.TrainerOverrides`,
whose public-named hooks this subclass implements), each touch with its version and a canary: when a library moves,
read docs/development.md's "Upgrading a library".
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import torch
import torch.distributed as dist

# Importing the Trainer imports transformers' integrations, which print "[INFO] Running in WANDB offline mode" on
# stdout when WANDB_MODE=offline (transformers 5.25): stdout carries only our JSON records, so that goes to stderr.
with contextlib.redirect_stdout(sys.stderr):
    from transformers import Trainer, TrainingArguments, get_scheduler
    from transformers.trainer_utils import EvalLoopOutput

from train.borrowed.torch_optim import scale_peaks
from train.borrowed.transformers_trainer import (
    TrainerOverrides,
    mark_scheduler_created,
    save_checkpoint_now,
    tokens_at_session_start,
    train_batch_size,
)
from train.common import distributed
from train.common.console import say
from train.common.schedules import WSD, full_steps_between, mask_rate, scheduler_kwargs
from train.common.writable import follow_umask
from train.data import ResumedStream, own_loader_state, stream_loader
from train.data.tokenization import joined
from train.model.collator import first_rows, thin_masks
from train.run.adapting import EncoderDrift, drop_encoder_gradients, with_head_rate
from train.run.batches import SAMPLES, merged_figure
from train.run.diagnostics import StepDiagnostics
from train.run.preemption import leave_signals_to_rank
from train.run.stragglers import Stragglers
from train.run.trainer_settings import TrainerSettings


class MLMTrainer(TrainerOverrides):
    """The Trainer, with data loader workers that leave the stop signals to their rank (train/run/preemption.py), a
    streamed corpus read through its own resumable loader, no warning for tied weights on resume, and weights saved
    with the umask's mode. Its settings are handed over whole at construction (``settings``,
    train/run/trainer_settings.py); with held-out rows to measure it on, every evaluation adds how far the encoder
    moved (train/run/adapting.py EncoderDrift)."""

    # The Trainer's own attributes this class reads and sets again (the type checker reads transformers as Any).
    compute_metrics: Any
    lr_scheduler: Any
    control: Any
    data_collator: Any

    def __init__(self, *args: Any, settings: TrainerSettings, **kwargs: Any) -> None:
        self.settings = settings
        self.mask_rate_now: float | None = None  # the rate of the step being trained, under a schedule
        self.batch_rows_now: int | None = None  # the global rows of the step being trained, under a batch warm-up
        self.head_warmup_steps = settings.head.warmup_steps  # adapting.py's AUTO_WARMUP: derived at the first step
        self.eval_parts = settings.eval_parts  # as they stand: a time budget may cut them (limit_evaluation)
        super().__init__(*args, **kwargs)
        self.diagnostics = StepDiagnostics(settings.token_flops, settings.peak)  # the records' MFU, data wait, ...
        self.add_callback(self.diagnostics)
        self.stragglers = Stragglers(self.model)  # each rank's own time per step, a slow one named
        if settings.saves is not None:  # the end of training waits for the save in flight
            self.add_callback(settings.saves)
        if settings.drift_batch is not None and self.compute_metrics is not None:
            # After the Trainer's __init__, which puts the model on its device: the starting embeddings are its own.
            drift = EncoderDrift(self.model, settings.drift_batch)
            self.compute_metrics = drift.alongside(self.compute_metrics, lambda: self.state.global_step)

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> tuple[list, Any]:
        """The batches of the next optimizer step (the Trainer's own): under a batch warm-up each cut to its share of
        the step's rows (train/model/collator.py first_rows), under a mask rate schedule each thinned to the step's
        rate (thin_masks), before the Trainer counts their tokens and masked tokens. Both follow the planned steps
        as they stand (``state.max_steps``, which a time budget re-plans; a phased run's plan); a resumed run has
        its step, so its batch and rate, from the checkpoint. Their coming is timed and they are counted for the
        records' diagnostics (train/run/diagnostics.py). After a rollback, the batches of the steps it skips are
        drawn and dropped first (train/run/rollback.py DataSkip), and those steps counted as taken, the learning
        rate's schedule with them: a step's number stays the place of its batches in the data, which the
        Trainer's resume (a restart's, a later rollback's) skips to; the schedule's peaks scaled by the rollback's
        spike_lr_factor."""
        skip = self.settings.skip
        if skip.due(self.state.global_step):
            skipped = skip.take(epoch_iterator, self.args.gradient_accumulation_steps)
            self.state.global_step += skipped
            for _ in range(skipped):
                self.lr_scheduler.step()
            if skip.lr_factor != 1.0:
                scale_peaks(self.lr_scheduler, skip.lr_factor)  # and the step ahead's rate
        batches = epoch_iterator
        done, total = self.state.global_step, self.planned_steps
        warmup, rates, phase = self.settings.batch_warmup, self.settings.mask_rates, self.settings.phase
        if warmup is not None:
            self.batch_rows_now = warmup.rows(done, total)
            rows = warmup.micro_batch_rows(
                done, total, max(self.args.world_size, 1), self.args.gradient_accumulation_steps
            )
            batches = (first_rows(batch, rows[i]) for i, batch in enumerate(batches))
        if rates is not None:
            first, final = rates
            start = phase.start if phase else 0  # in a phase, its rates go from its first step to its last
            rate = mask_rate(first, final, done - start, self.state.max_steps - start)
            self.mask_rate_now = rate
            batches = (thin_masks(batch, rate) for batch in batches)
        samples, items = super().get_batch_samples(self.diagnostics.timed(batches), num_batches, device)
        self.diagnostics.fetched(samples)
        return samples, items

    @property
    def planned_steps(self) -> int:
        """The plan's steps as they stand, which the batch warm-up's ramp is a share of: a phased run's whole plan,
        else the Trainer's max_steps (a time budget re-plans them)."""
        phase = self.settings.phase
        return phase.total if phase else self.state.max_steps

    def steps_cost(self, start: int, end: int) -> float:
        """The steps after ``start`` up to ``end`` in full steps of the plan as it stands (the log's ETA): a batch
        warm-up's steps cost their share of the full batch."""
        return full_steps_between(self.settings.batch_warmup, start, end, self.planned_steps)

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        """The Trainer's forward and backward; while the head warms up, the encoder's gradients then dropped, so that
        only the head trains. Dropped rather than ``requires_grad`` turned off: DDP, built without
        find_unused_parameters, waits for every parameter it was given at every step. The step is the Trainer's
        count, a resumed checkpoint's included: a resume inside the warm-up stays frozen until its end."""
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.head_warmup_steps < 0:  # a new head's default: the learning rate's warm-up, a tenth of the run at most
            steps = self.state.max_steps
            self.head_warmup_steps = min(self.args.get_warmup_steps(steps), steps // 10)
            if distributed.is_world_zero() and self.head_warmup_steps:
                say(
                    f"the MLM head is new: it trains alone, the encoder frozen, for the learning rate's "
                    f"{self.head_warmup_steps} warm-up steps (head_warmup_steps sets how many; 0: none)"
                )
        if self.state.global_step < self.head_warmup_steps:
            drop_encoder_gradients(self.settings.head.frozen)
        return loss

    def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
        """The Trainer's optimizer, with head_learning_rate the head's parameters in groups of their own at it."""
        fresh = self.optimizer is None
        optimizer = super().create_optimizer(model)
        head = self.settings.head
        if fresh and head.learning_rate is not None:
            with_head_rate(optimizer, head.parameters, head.learning_rate)
        return optimizer

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """The Trainer's log, a training record with where its steps' time went (train/run/diagnostics.py: MFU,
        data wait, packing efficiency) and each rank's own time (train/run/stragglers.py), under a mask rate
        schedule with the rate of its step, under a batch warm-up with its step's global rows."""
        if self.mask_rate_now is not None and "loss" in logs:
            logs = {**logs, "mlm_probability": round(self.mask_rate_now, 6)}
        if self.batch_rows_now is not None and "loss" in logs:
            logs = {**logs, "batch_rows": self.batch_rows_now}
        if "loss" in logs:
            waited, steps = self.diagnostics.waited()
            logs = {**logs, **self.diagnostics.window()}
            logs = {**logs, **self.stragglers.window(self.state.global_step, steps, waited)}  # a collective
        super().log(logs, start_time)

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        """The Trainer's scheduler, with warmup_stable_decay's decay given as a fraction of the steps
        (train/config/recipes.py): transformers takes it only as a number of steps, unknown until training starts.
        (Replaces ``Trainer.create_scheduler``, transformers 5.25, which does nothing else.)"""
        if self.lr_scheduler is None:
            optimizer = self.optimizer if optimizer is None else optimizer
            phase = self.settings.phase
            total = phase.total if phase else num_training_steps  # a phase trains part of one schedule
            decay = phase.decay_steps if phase else None
            warmup = self.args.get_warmup_steps(total)
            self.lr_scheduler = lr_scheduler_for(self.args, total, warmup, optimizer, self.settings.decay_ratio, decay)
            mark_scheduler_created(self)
        return self.lr_scheduler

    def evaluation_loop(
        self,
        dataloader: Any,
        description: str,
        prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> EvalLoopOutput:
        """The Trainer's evaluation, with the held-out examples it read among its figures (``eval_samples``: a time
        budget's evaluations read a sample of the set, train/run/budget_evaluation.py). A mixture's: each source's
        held-out part on its own (``eval_<key>_loss``, ...), and the whole's figures from theirs
        (train/run/batches.py merged_figure) - one pass over the held-out text, where the Trainer's own several
        evaluation sets would each log and call the callbacks as a separate evaluation."""
        parts = self.eval_parts
        if not parts or getattr(dataloader, "dataset", None) is not self.eval_dataset:  # another set: as given
            return counted(
                super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix),
                metric_key_prefix,
            )
        outputs = {
            key: counted(
                super(MLMTrainer, self).evaluation_loop(
                    self.get_eval_dataloader(part),
                    description,
                    prediction_loss_only,
                    ignore_keys,
                    f"{metric_key_prefix}_{key}",
                ),
                f"{metric_key_prefix}_{key}",
            )
            for key, part in parts.items()
        }
        metrics = {name: value for output in outputs.values() for name, value in output.metrics.items()}
        samples = sum(output.num_samples for output in outputs.values())
        first, output = next(iter(outputs.items()))
        for name in output.metrics:
            figure = name.removeprefix(f"{metric_key_prefix}_{first}_")
            values = [(o.metrics.get(f"{metric_key_prefix}_{k}_{figure}"), o.num_samples) for k, o in outputs.items()]
            if all(isinstance(value, (int, float)) for value, _ in values):
                metrics[f"{metric_key_prefix}_{figure}"] = merged_figure(figure, values)
        return EvalLoopOutput(predictions=None, label_ids=None, metrics=metrics, num_samples=samples)

    def limit_evaluation(self, cut: Callable[[Any], Any]) -> None:
        """Every later evaluation reads ``cut`` of the held-out set (a time budget's sample,
        train/run/budget_evaluation.py): of each mixture part, the parts then joined again, or of the one set."""
        if self.eval_parts:
            self.eval_parts = {key: cut(part) for key, part in self.eval_parts.items()}
            self.eval_dataset = joined(self.eval_parts.values())
        else:
            self.eval_dataset = cut(self.eval_dataset)

    def save_interrupted(self) -> None:
        """A checkpoint of the current step, for a stop that came during an evaluation (every rank calls this, as the
        Trainer's own save needs), and the callbacks told of it; written before this returns, in the background or
        not: the job exits next."""
        save_checkpoint_now(self)
        self.control = self.callback_handler.on_save(self.args, self.state, self.control)
        if self.settings.saves is not None:
            self.settings.saves.wait()

    def save_checkpoint(self, model: Any, trial: Any) -> None:
        """The Trainer's checkpoint save; with background saves (train/run/saving.py) only its part on the training
        thread: the state copied out, the rest written behind the loop from the marker's ``on_save`` on."""
        if self.settings.saves is None:
            super().save_checkpoint(model, trial)
        else:
            self.settings.saves.take(self, trial)

    def get_train_dataloader(self) -> Any:
        if not isinstance(self.train_dataset, datasets.IterableDataset):
            return leave_signals_to_rank(super().get_train_dataloader())
        # streaming: train/data/stream.py, resumed on another number of ranks: train/data/stream_resume.py
        args, batch, collate = self.args, train_batch_size(self), self.data_collator

        def loader_of(dataset: Any, batch_size: int, workers: int | None = None, collate: Any = collate) -> Any:
            return leave_signals_to_rank(stream_loader(dataset, args, batch_size, collate, workers))

        position = self.settings.stream_position
        if position is None:
            return loader_of(self.train_dataset, batch)
        own = loader_of(self.train_dataset, batch)
        state = own_loader_state(position, args.process_index, args.world_size, batch, own.num_workers)
        if state is not None:
            own.load_state_dict(state)
            return own

        def remainder_loader(dataset: Any, batch_size: int, workers: int) -> Any:
            return loader_of(dataset, batch_size, workers, collate=list)  # examples, collated by ResumedStream

        part = self.settings.stream_part
        if part is None:  # trainer_settings.resumed_stream gives both or neither
            raise ValueError("a resumed stream's position came without the stream's parts")
        return ResumedStream(position, part, remainder_loader, own, batch, collate)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        # The Trainer builds both loaders with self.data_collator: evaluation's rate is swapped in for its loader.
        training_collator = self.data_collator
        self.data_collator = self.settings.eval_collator or training_collator
        try:
            return leave_signals_to_rank(super().get_eval_dataloader(eval_dataset))
        finally:
            self.data_collator = training_collator

    def save_weights(self, output_dir: str | None, state_dict: dict | None) -> None:
        """The Trainer's save of a checkpoint's or final/'s model, its weights then given the umask's mode as the
        other files are (train/common/writable.py follow_umask says why), by the rank that wrote them."""
        super().save_weights(output_dir, state_dict)
        if self.args.should_save:
            follow_umask(Path(output_dir or self.args.output_dir).glob("*.safetensors"))

    def gather_for_save(self) -> None:
        """Called on every rank before rank 0 saves the final model: nothing to gather for a whole replica
        (train/run/sharding.py's trainer gathers its shards here)."""

    def track_num_input_tokens(self, inputs: dict[str, Any]) -> None:
        """The Trainer counts real tokens as ``attention_mask.sum()``: a 4D per-document mask (train/model/packing.py)
        would count positions squared, and ModernBERT's dict of masks has no sum. Those layouts (packed, padding
        free) have no padding position, so every position counts: counting the tokens that are not the pad id, as
        the Trainer does without a mask, would miss a masked token randomly replaced by the pad token."""
        mask = inputs.get("attention_mask")
        if mask is not None and not (isinstance(mask, torch.Tensor) and mask.dim() == 2):
            inputs = {**inputs, "attention_mask": torch.ones_like(inputs["input_ids"])}
        super().track_num_input_tokens(inputs)

    def missing_keys_to_report(self, missing: list[str]) -> list[str]:
        """Resuming warns "missing keys: vocab_projector.weight" for a weight tied to the embeddings (safetensors
        stores it once; the Trainer's own exemption only covers ``_keys_to_ignore_on_save``): an expected case,
        so tied names are left out of the warning and the tie is restored."""
        tied = tied_parameter_names(self.model)
        if tied & set(missing):
            self.model.tie_weights()
            return [k for k in missing if k not in tied]
        return missing


def counted(output: EvalLoopOutput, prefix: str) -> EvalLoopOutput:
    """``output`` with the held-out examples its evaluation read among its figures (``<prefix>_samples``)."""
    output.metrics[f"{prefix}_{SAMPLES}"] = output.num_samples
    return output


def lr_scheduler_for(
    args: TrainingArguments, total: int, warmup: int, optimizer: Any, decay_ratio: float, decay: int | None = None
) -> Any:
    """transformers' scheduler of ``args.lr_scheduler_type`` for ``total`` steps with ``warmup`` of warm-up (the
    Trainer's, and the time budget's re-plans: one rule for both); ``decay``: warmup_stable_decay's decay in steps
    (a phased run's decay phases), else ``decay_ratio`` of the steps."""
    kwargs = dict(args.lr_scheduler_kwargs or {})
    if decay is not None and schedule_kind(args) == WSD and "num_stable_steps" not in kwargs:
        kwargs.setdefault("num_decay_steps", min(decay, max(total - warmup, 1)))
    kwargs = scheduler_kwargs(schedule_kind(args), kwargs, total, warmup, decay_ratio)
    return get_scheduler(
        args.lr_scheduler_type,
        optimizer=optimizer,
        num_warmup_steps=warmup,
        num_training_steps=total,
        scheduler_specific_kwargs=kwargs,
    )


def schedule_kind(args: TrainingArguments) -> str:
    """``lr_scheduler_type``'s name (TrainingArguments makes it a SchedulerType)."""
    kind = args.lr_scheduler_type
    return str(getattr(kind, "value", kind))


def step_schedule(scheduler: Any) -> torch.optim.lr_scheduler.LambdaLR | None:
    """The Trainer's scheduler as a function of the step (accelerate's wrapper taken off), whose learning-rate
    functions the time budget rebuilds (train/run/budget.py); None for one that is not (reduce_lr_on_plateau)."""
    inner = getattr(scheduler, "scheduler", scheduler)
    return inner if isinstance(inner, torch.optim.lr_scheduler.LambdaLR) else None


def tied_parameter_names(model: torch.nn.Module) -> set[str]:
    """Names of parameters that share their storage with another parameter (tied weights)."""
    owners: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(parameter), []).append(name)
    return {name for names in owners.values() if len(names) > 1 for name in names}


def losses_are_batch_means(trainer: Trainer) -> None:
    """Both heads' MLM losses are means over the micro-batch and ignore ``num_items_in_batch``; without this the
    Trainer neither divides by gradient_accumulation_steps nor leaves the world size out (measured: accumulation
    4 gave a 4x gradient norm and logged loss). ``model_accepts_loss_kwargs`` is the Trainer's own switch for it
    (an attribute it sets in ``__init__`` from the model's forward signature, transformers 5.25). A function, not a
    method of MLMTrainer: train/run/finetune.py's classifier, a plain Trainer, takes it too."""
    trainer.model_accepts_loss_kwargs = False


def tokens_seen_this_session(trainer: Trainer) -> int:
    """Real tokens the Trainer counted since this process started training (a resumed run's count starts at the
    checkpoint's)."""
    return trainer.state.num_input_tokens_seen - tokens_at_session_start(trainer)


def apply_ddp_timeout(training: TrainingArguments) -> None:
    """Give the CPU process group ``ddp_timeout``, as a GPU one gets it.

    TrainingArguments starts the process group while it is built, and passes ddp_timeout to accelerate only on
    the GPU path (transformers 5.25, ``_setup_devices``): with ``use_cpu`` gloo keeps its 30-minute default
    whatever MLM_DDP_TIMEOUT says. (torch 2.15 made the change of a started group's timeout public.)"""
    if training.use_cpu and distributed.initialized():
        dist.set_timeout(training.ddp_timeout_delta)
