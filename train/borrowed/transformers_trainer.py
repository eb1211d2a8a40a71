"""What we borrow from transformers' Trainer (transformers 5.25, ``transformers/trainer.py``): the private methods
our Trainer subclasses override, each turned into a public-named hook by :class:`TrainerOverrides`, and the private
attributes and methods the job reads, sets or calls on a Trainer."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from train.borrowed.touch import borrows

# Importing the Trainer imports transformers' integrations, which print "[INFO] Running in WANDB offline mode" on
# stdout when WANDB_MODE=offline (transformers 5.25): stdout carries only our JSON records, so that goes to stderr.
with contextlib.redirect_stdout(sys.stderr):
    from transformers import Trainer

    # public names of the trainer module, imported here (the first import of it) for the redirect: re-exported
    from transformers.trainer import OPTIMIZER_NAME as OPTIMIZER_NAME
    from transformers.trainer import SCALER_NAME as SCALER_NAME
    from transformers.trainer import SCHEDULER_NAME as SCHEDULER_NAME
    from transformers.trainer_callback import ExportableState
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, SaveStrategy, rotate_checkpoints
    from transformers.training_args import ParallelMode


class TrainerOverrides(Trainer):
    """The Trainer with each private method our subclasses override (train/run/trainer.py, train/run/sharding.py)
    handed to a public-named hook. The hook is the private method's name without its underscore (``_save`` ->
    :meth:`save_weights`, the one exception) and does what the Trainer does by default; a subclass overrides the
    hook and calls ``super().<hook>(...)`` for the Trainer's own behaviour. transformers 5.25 has no public
    extension point for any of them: they are where the Trainer counts tokens, reports a checkpoint's keys, and
    writes and reads a checkpoint's weights and optimizer."""

    @borrows("transformers", "5.25", "trainer.py Trainer._track_num_input_tokens")
    def _track_num_input_tokens(self, inputs: dict[str, Any]) -> None:
        """The Trainer counts real tokens here at every step (transformers 5.25, ``trainer.py``,
        ``Trainer._track_num_input_tokens``, called from the training loop): our count of a packed batch's tokens
        replaces its ``attention_mask.sum()``. No public hook sees a batch's inputs before they are counted."""
        self.track_num_input_tokens(inputs)

    def track_num_input_tokens(self, inputs: dict[str, Any]) -> None:
        """Hook: count ``inputs``' tokens into ``state.num_input_tokens_seen`` (the Trainer's count)."""
        super()._track_num_input_tokens(inputs)

    @borrows("transformers", "5.25", "trainer.py Trainer._issue_warnings_after_load")
    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """The Trainer warns of a checkpoint's missing and unexpected keys here after loading its weights
        (transformers 5.25, ``trainer.py``, ``Trainer._issue_warnings_after_load``; ``load_result`` is torch's
        ``IncompatibleKeys`` named tuple): the keys a subclass expects to be missing are left out of the warning
        (:meth:`missing_keys_to_report`). The Trainer's own exemption (``_keys_to_ignore_on_save``) is not
        configurable, and no public hook sees the load result."""
        missing = list(load_result.missing_keys)
        kept = self.missing_keys_to_report(missing)
        if kept != missing:
            load_result = load_result._replace(missing_keys=kept)
        super()._issue_warnings_after_load(load_result)

    def missing_keys_to_report(self, missing: list[str]) -> list[str]:
        """Hook: of a loaded checkpoint's ``missing`` keys, those worth a warning (all of them by default); it may
        repair the model for the others (tie its weights)."""
        return missing

    @borrows("transformers", "5.25", "trainer.py Trainer.save_model(_internal_call=True)")
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """A checkpoint's weights are saved through ``save_model(output_dir, _internal_call=True)`` on every rank
        (transformers 5.25, ``trainer.py``, ``Trainer._save_checkpoint``), the final model with the public call:
        the private flag is the only way to tell them apart, and :meth:`save_checkpoint_model` gets the first."""
        if _internal_call:
            self.save_checkpoint_model(output_dir)
        else:
            super().save_model(output_dir, _internal_call)

    def save_checkpoint_model(self, output_dir: str | None) -> None:
        """Hook: a checkpoint's weights (and config, tokenizer, arguments) into ``output_dir`` (the Trainer's)."""
        super().save_model(output_dir, _internal_call=True)

    @borrows("transformers", "5.25", "trainer.py Trainer._save")
    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Where every save of the Trainer's ends: ``save_pretrained`` of the model with ``state_dict``, the
        tokenizer and the training arguments (transformers 5.25, ``trainer.py``, ``Trainer._save``, called from
        ``save_model``). A sharded model hands its gathered weights here (:meth:`save_weights`): ``save_model``
        takes no state dict."""
        self.save_weights(output_dir, state_dict)

    def save_weights(self, output_dir: str | None, state_dict: dict | None) -> None:
        """Hook: write the model (``state_dict`` when given), tokenizer and arguments (the Trainer's ``_save``)."""
        self.trainer_save(output_dir, state_dict)

    def trainer_save(self, output_dir: str | None, state_dict: dict | None) -> None:
        """The Trainer's own ``_save``, whatever a subclass's :meth:`save_weights` does."""
        super()._save(output_dir, state_dict=state_dict)

    @borrows("transformers", "5.25", "trainer.py Trainer._load_from_checkpoint")
    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        """The Trainer loads a resumed checkpoint's weights here (transformers 5.25, ``trainer.py``,
        ``Trainer._load_from_checkpoint``, called from ``train``): a sharded model reads its shards through
        torch.distributed.checkpoint instead. ``train(resume_from_checkpoint=...)`` has no loader to hand in."""
        self.load_from_checkpoint(resume_from_checkpoint, model)

    def load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        """Hook: load the weights of the checkpoint at ``resume_from_checkpoint`` into ``model`` (the Trainer's)."""
        super()._load_from_checkpoint(resume_from_checkpoint, model)

    @borrows("transformers", "5.25", "trainer.py Trainer._save_optimizer_and_scheduler")
    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """The Trainer writes a checkpoint's optimizer and scheduler state here (transformers 5.25, ``trainer.py``,
        ``Trainer._save_optimizer_and_scheduler``, called from ``_save_checkpoint``): rank 0's ``torch.save`` of a
        sharded optimizer would keep one shard. No public option says how the optimizer is saved."""
        self.save_optimizer_and_scheduler(output_dir)

    def save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """Hook: write the optimizer's and the scheduler's state into ``output_dir`` (the Trainer's)."""
        super()._save_optimizer_and_scheduler(output_dir)

    @borrows("transformers", "5.25", "trainer.py Trainer._load_optimizer_and_scheduler")
    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """The Trainer reads a resumed checkpoint's optimizer and scheduler state here (transformers 5.25,
        ``trainer.py``, ``Trainer._load_optimizer_and_scheduler``, called from ``train``): the counterpart of
        :meth:`_save_optimizer_and_scheduler`, with no public way in either."""
        self.load_optimizer_and_scheduler(checkpoint)

    def load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """Hook: read the optimizer's and the scheduler's state of ``checkpoint`` (the Trainer's)."""
        super()._load_optimizer_and_scheduler(checkpoint)

    @borrows("transformers", "5.25", "trainer.py Trainer._save_checkpoint")
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """The training loop saves a checkpoint of the current step here, on every rank (transformers 5.25,
        ``trainer.py``, ``Trainer._save_checkpoint``, called from ``_maybe_log_save_evaluate``): a background save
        (train/run/saving.py) takes the state out here and writes it behind the loop. No public option says how,
        or when, the Trainer writes a checkpoint."""
        self.save_checkpoint(model, trial)

    def save_checkpoint(self, model: Any, trial: Any) -> None:
        """Hook: a checkpoint of the current step, written and the older ones rotated away (the Trainer's)."""
        super()._save_checkpoint(model, trial)


@borrows("transformers", "5.25", "trainer.py Trainer._save_checkpoint")
def save_checkpoint_in_parts(
    trainer: Trainer, trial: Any, take_out: Callable[[str], None], state_name: str
) -> Callable[[], None]:
    """The Trainer's checkpoint save in the order it runs (transformers 5.25, ``trainer.py``,
    ``Trainer._save_checkpoint``), for a background save (train/run/saving.py), on every rank: where the Trainer
    writes the weights, then the optimizer, scheduler and scaler, ``take_out(checkpoint directory)`` takes their
    state instead, to be written later; each rank's RNG state is written here as the Trainer writes it;
    trainer_state.json is written as ``state_name`` (a resume takes a checkpoint without trainer_state.json for one
    cut off: it is renamed once the weights and optimizer are written); and the rotation of the older checkpoints,
    which the Trainer runs at once, is returned, to run once this one is complete. The Trainer's push of a checkpoint
    is left out: the job never hands it ``push_to_hub`` (train/config/implied.py). The Trainer has no way to save a
    checkpoint in parts, nor to put its rotation off."""
    if trainer.hp_search_backend is None and trial is None:
        trainer.store_flos()
    run_dir = trainer._get_output_dir(trial=trial)
    output_dir = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}")
    os.makedirs(output_dir, exist_ok=True)  # the Trainer's _save makes it on rank 0, _save_rng_state on all
    take_out(output_dir)
    args, state = trainer.args, trainer.state
    if args.save_strategy in (SaveStrategy.STEPS, SaveStrategy.EPOCH, SaveStrategy.BEST) and state.best_global_step:
        if args.parallel_mode == ParallelMode.DISTRIBUTED:
            dist.barrier()
        best = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.best_global_step}")
        if os.path.exists(best):
            state.best_model_checkpoint = best
    if not args.save_only_model:
        trainer._save_rng_state(output_dir)
    if not args.should_save:
        return lambda: None
    exportable = [c for c in [*trainer.callback_handler.callbacks, trainer.control] if isinstance(c, ExportableState)]
    for callback in exportable:  # their state as of this step, in trainer_state.json
        name, exported = callback.__class__.__name__, callback.state()
        if isinstance(state.stateful_callbacks[name], list):
            state.stateful_callbacks[name].append(exported)
        else:
            state.stateful_callbacks[name] = exported
    state.save_to_json(os.path.join(output_dir, state_name))
    return functools.partial(
        rotate_checkpoints,
        output_dir=run_dir,
        save_total_limit=args.save_total_limit,
        best_model_checkpoint=state.best_model_checkpoint,
        use_mtime=True,
    )


@borrows("transformers", "5.25", "trainer.py Trainer._save_checkpoint")
def save_checkpoint_now(trainer: Trainer) -> None:
    """A checkpoint of the current step, as the training loop saves one (transformers 5.25, ``trainer.py``,
    ``Trainer._save_checkpoint(model, trial)``): for a stop that came during an evaluation, outside the loop's own
    save. Every rank calls it, as the Trainer's save needs. The Trainer has no public way to save a checkpoint
    (``save_model`` writes the weights alone)."""
    trainer._save_checkpoint(trainer.model_wrapped, trial=None)


@borrows("transformers", "5.25", "trainer.py Trainer._initial_num_input_tokens_seen")
def tokens_at_session_start(trainer: Trainer) -> int:
    """The real tokens counted before this process started training: a resumed checkpoint's count, 0 otherwise
    (transformers 5.25, ``trainer.py``, ``Trainer._initial_num_input_tokens_seen``, set in ``_inner_training_loop``
    and read by ``log`` for its own per-session figure). Not exposed publicly; 0 before training."""
    return getattr(trainer, "_initial_num_input_tokens_seen", 0)


@borrows("transformers", "5.25", "trainer.py Trainer._train_batch_size")
def train_batch_size(trainer: Trainer) -> int:
    """The per-device batch size the Trainer's loader uses (transformers 5.25, ``trainer.py``,
    ``Trainer._train_batch_size``: ``args.train_batch_size``, lowered by ``auto_find_batch_size``). A streamed
    corpus builds its own loader with it; there is no public attribute for it."""
    return trainer._train_batch_size


@borrows("transformers", "5.25", "trainer.py Trainer._created_lr_scheduler")
def mark_scheduler_created(trainer: Trainer) -> None:
    """Tell the Trainer its scheduler was created by ``create_scheduler`` (transformers 5.25, ``trainer.py``,
    ``Trainer.create_scheduler`` sets ``_created_lr_scheduler``; ``_prepare_for_training`` then drops the scheduler
    before another ``train`` call builds it again for its steps). Our ``create_scheduler`` builds its own scheduler
    (train/run/trainer.py): the flag is private and has no public setter."""
    trainer._created_lr_scheduler = True
