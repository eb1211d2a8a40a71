"""The per-rank program torchrun starts: build data, model, collator and Trainer; train; rank 0 writes outputs.

Run as ``python -m train.job [--option value ...]`` under torchrun (the launcher builds that command). It reads
the same configuration as the launcher, plus the launcher's decisions appended as CLI flags and the facts of them
it shows (``MLM_LAUNCH``, train/handoff.py).
"""

from __future__ import annotations

import errno
import functools
import math
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from transformers import Trainer, TrainerCallback, set_seed

from train import logs
from train.collator import MaskingCollator
from train.config import Config, load_config
from train.console import now, say, warn
from train.data import load_raw, real_token_count, tokenize
from train.errors import EXIT_CRASH, ConfigError, EnvironmentProblem, Preempted, UserError, run_main
from train.handoff import Handoff
from train.model import load_model, load_tokenizer, scratch_config, use_masked_only_head
from train.outputs import (
    check_output_dir,
    find_resume_checkpoint,
    mark_complete,
    publish_final,
    run_facts,
    write_json_atomic,
)


class EpochForCollator(TrainerCallback):
    """Tells the collator the epoch before the epoch's dataloader iterator (and its workers) is created."""

    def __init__(self, collator: MaskingCollator) -> None:
        self.collator = collator

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.collator.epoch = int(state.epoch or 0)


class CheckpointCompleteMarker(TrainerCallback):
    """Marks a checkpoint complete once the Trainer has finished writing it, so resume never picks half of one."""

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if checkpoint.is_dir():
                mark_complete(checkpoint)


class StopOnSigterm(TrainerCallback):
    """SIGTERM (docker stop, eviction, spot reclaim): save a checkpoint at the next step boundary and stop.

    Ranks may receive the signal at different steps, so after each step they agree through one tiny all-reduce;
    every rank then stops at the same step and takes part in the same checkpoint.
    """

    def __init__(self) -> None:
        self.requested = False
        self.stopped = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True

    def _agreed(self, device: torch.device) -> bool:
        if not (dist.is_available() and dist.is_initialized()):
            return self.requested
        flag = torch.tensor([1.0 if self.requested else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._agreed(args.device):
            self.stopped = True
            control.should_save = True
            control.should_training_stop = True


def _worker_ignores_sigterm(worker_id: int, init_fn: Callable[[int], None] | None) -> None:
    """Data loader worker init: ignore SIGTERM, then the Trainer's own init (seeding).

    torchrun stops a rank with killpg(), which reaches the rank's data loader workers too; PyTorch's workers die
    on a SIGTERM that is not from their parent, and the rank would then fail its step with "DataLoader worker ...
    killed by signal: Terminated" instead of saving the checkpoint. The rank shuts its workers down itself.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if init_fn is not None:
        init_fn(worker_id)


def _leave_sigterm_to_rank(loader: Any) -> Any:
    # accelerate's prepared loader wraps the torch DataLoader (base_dataloader) and forwards attribute reads only.
    base = getattr(loader, "base_dataloader", loader)
    base.worker_init_fn = functools.partial(_worker_ignores_sigterm, init_fn=base.worker_init_fn)
    return loader


class MLMTrainer(Trainer):
    """The Trainer, with data loader workers that leave SIGTERM to their rank (see _worker_ignores_sigterm)."""

    def get_train_dataloader(self) -> Any:
        return _leave_sigterm_to_rank(super().get_train_dataloader())

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        return _leave_sigterm_to_rank(super().get_eval_dataloader(eval_dataset))


def write_report_safely(output_dir: Path) -> None:
    """The report is a convenience: failing to draw it must not fail a finished or preempted run."""
    try:
        from train.report import write_report  # plotting is imported only when a run ends

        write_report(output_dir)
    except Exception as exc:  # noqa: BLE001 - any drawing failure is only a warning
        warn(f"no report ({type(exc).__name__}: {exc}); try: entrypoint.sh report {output_dir}")


def masked_accuracy(eval_pred: Any) -> dict[str, float]:
    predictions, labels = eval_pred
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    masked = labels != -100
    return {"accuracy": float((predictions[masked] == labels[masked]).mean()) if masked.any() else 0.0}


def argmax_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Keep predicted ids, not [batch, length, vocab] logits, across evaluation batches."""
    return logits.argmax(dim=-1)


def build_trainer(config: Config) -> tuple[Trainer, dict[str, Any]]:
    """Data, tokenizer, model, collator and Trainer for this rank."""
    training, job = config.training, config.job
    # Rank 0 reads the data, trains a tokenizer if one is needed and tokenizes; the other ranks then load the
    # same results from the caches instead of repeating the work.
    with training.main_process_first(desc="preparing data"):
        raw = load_raw(config)
        arch = scratch_config(config)
        tokenizer = load_tokenizer(config, raw, from_scratch=arch is not None)
        tokenized = tokenize(config, raw, tokenizer)
    model = load_model(config, arch, tokenizer)
    if job.masked_only_head:
        try:
            use_masked_only_head(model)
        except ConfigError:
            if "masked_only_head" in config.sources:  # asked for explicitly: say it cannot be done
                raise
            warn(f"masked_only_head: not supported for {type(model).__name__}; training with the dense head")
    collator = MaskingCollator(
        pad_token_id=tokenizer.pad_token_id,
        mask_token_id=tokenizer.mask_token_id,
        vocab_size=len(tokenizer),
        mlm_probability=job.mlm_probability,
        seed=training.seed,
        pad_to_multiple_of=job.pad_to_multiple_of if job.padding == "dynamic" else None,
    )
    evaluating = "validation" in tokenized and training.eval_strategy != "no"
    trainer = MLMTrainer(
        model=model,
        args=training,
        train_dataset=tokenized["train"],
        eval_dataset=tokenized["validation"] if "validation" in tokenized else None,
        data_collator=collator,
        processing_class=tokenizer,
        compute_metrics=masked_accuracy if evaluating else None,
        preprocess_logits_for_metrics=argmax_logits if evaluating else None,
        callbacks=[EpochForCollator(collator), CheckpointCompleteMarker()],
    )
    # Both heads' MLM losses are means over the micro-batch and ignore num_items_in_batch; without this the Trainer
    # neither divides by gradient_accumulation_steps nor leaves the world size out (measured: accumulation 4 gave
    # a 4x gradient norm and logged loss).
    trainer.model_accepts_loss_kwargs = False
    facts = {
        "dataset_fingerprint": raw.fingerprint,
        "train_samples": len(tokenized["train"]),
        "eval_samples": len(tokenized["validation"]) if "validation" in tokenized else 0,
        "train_real_tokens": real_token_count(tokenized["train"], tokenizer.pad_token_id),
        "tokenizer": tokenizer,
    }
    return trainer, facts


def final_evaluation(trainer: Trainer) -> dict[str, Any]:
    """The evaluation of the final weights: reused when the eval strategy just ran one at the last step."""
    step = trainer.state.global_step
    for entry in reversed(trainer.state.log_history):
        if "eval_loss" in entry:
            if entry.get("step") == step:
                return {k: v for k, v in entry.items() if k.startswith("eval_")}
            break
    return trainer.evaluate()


def main(argv: list[str] | None = None) -> int:
    config = load_config(sys.argv[1:] if argv is None else argv)
    try:
        return train(config)
    except dist.DistBackendError as exc:
        # Another rank died (a node lost, killed or preempted without a checkpoint): say so in one line, and exit 1
        # (a crash, worth retrying) rather than the 2/3 that tell Kubernetes not to retry.
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UserError(
            f"lost contact with another rank ({first}): a node or process failed; check its logs",
            exit_code=EXIT_CRASH,
        ) from exc
    except OSError as exc:
        if exc.errno == errno.ENOSPC:  # a checkpoint or the final model did not fit; earlier ones are intact
            raise EnvironmentProblem(
                f"{config.source_of('output_dir')}={config.training.output_dir!r}: no space left on the device "
                "while writing; free space or use a larger volume, then run again to resume"
            ) from None
        raise


def train(config: Config) -> int:
    training = config.training
    logs.configure_console(config)
    started = now()
    output_dir = check_output_dir(config)
    handoff = Handoff.from_environ()
    set_seed(training.seed)
    stopper = StopOnSigterm()
    trainer, facts = build_trainer(config)
    logs.attach(trainer, config, facts, handoff)
    trainer.add_callback(stopper)
    resume = find_resume_checkpoint(config, warn)
    if resume:
        warn(f"resuming from {resume}")

    result = trainer.train(resume_from_checkpoint=resume)
    world_size = training.world_size

    def write_run_facts(status: str) -> None:
        facts_json = run_facts(
            config,
            world_size=world_size,
            dataset_fingerprint=facts["dataset_fingerprint"],
            started=started,
            status=status,
            handoff=handoff,
        )
        write_json_atomic(output_dir / "run.json", facts_json)
        write_report_safely(output_dir)

    if stopper.stopped:
        if trainer.is_world_process_zero():
            write_run_facts("preempted")
        raise Preempted(f"stopped by SIGTERM at step {trainer.state.global_step}; checkpoint saved in {output_dir}")

    metrics: dict[str, Any] = dict(result.metrics)
    # Real (non-padding) tokens per second: samples per second times the real tokens of an average sample.
    tokens_per_sample = facts["train_real_tokens"] / max(facts["train_samples"], 1)
    metrics["train_tokens_per_second"] = (
        metrics.get("train_samples_per_second", 0.0) * tokens_per_sample if metrics.get("train_runtime") else 0.0
    )
    if trainer.eval_dataset is not None:
        evaluation = final_evaluation(trainer)
        metrics.update(evaluation)
        metrics["perplexity"] = math.exp(evaluation["eval_loss"]) if evaluation["eval_loss"] < 700 else math.inf
    metrics.update(world_size=world_size, train_samples=facts["train_samples"], eval_samples=facts["eval_samples"])

    # Rank 0 writes every file; under DDP each rank holds the same weights, so the others have nothing to add.
    tokenizer = facts["tokenizer"]

    def write_model(directory: Path) -> None:
        trainer.save_model(str(directory))
        tokenizer.save_pretrained(str(directory))

    if trainer.is_world_process_zero():
        publish_final(output_dir, write_model)
        write_json_atomic(output_dir / "all_results.json", metrics)
        write_run_facts("finished")
        say(f"finished: model in {output_dir / 'final'}")
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return 0


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    try:
        code = run_main(main)
    finally:
        cleanup()
    sys.exit(code)
