"""The per-rank program torchrun starts: build data, model, collator and Trainer; train; rank 0 writes outputs.

Run as ``python -m train.job [--option value ...]`` under torchrun (the launcher builds that command). It reads
the same configuration as the launcher, plus the launcher's decisions appended as CLI flags and the facts of them
it shows (``MLM_LAUNCH``, train/handoff.py).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import torch.distributed as dist
from datasets import DatasetDict

# Importing the Trainer imports transformers' integrations, which print "[INFO] Running in WANDB offline mode" on
# stdout when WANDB_MODE=offline (transformers 5.24): stdout carries only our JSON records, so that goes to stderr.
with contextlib.redirect_stdout(sys.stderr):
    from transformers import Trainer, TrainingArguments, set_seed

from train import logs
from train.callbacks import CheckpointCompleteMarker, DivergenceGuard, EpochForCollator, finite_weights
from train.checkpoints import decide_resume, newest_resumable, resumed_options
from train.collator import MaskingCollator
from train.config import Config, load_config, withhold_secrets
from train.console import now, say, warn
from train.data import RawData, load_raw, real_token_count, tokenize, truncation
from train.errors import EXIT_CRASH, ConfigError, EnvironmentProblem, Preempted, UserError, exit_process, run_main
from train.handoff import Handoff
from train.hf import cache_root
from train.lease import OutputLease
from train.model import load_model, load_tokenizer, scratch_config, use_masked_only_head
from train.outputs import (
    check_cache_dir,
    check_output_dir,
    publish_final,
    run_facts,
    start_over,
    write_json_atomic,
)
from train.preemption import EvaluationInterrupted, StopOnSignal, leave_signals_to_rank
from train.stream import StreamPosition, load_stream_raw, stream_loader, tokenized_stream

LOW_SPACE_BYTES = 16 * 2**20  # a write that failed with less free than this failed for want of space


class MLMTrainer(Trainer):
    """The Trainer, with data loader workers that leave the stop signals to their rank (train/preemption.py)."""

    stream_position: dict[str, Any] | None = None  # a resumed stream's saved position for this rank

    def get_train_dataloader(self) -> Any:
        if isinstance(self.train_dataset, datasets.IterableDataset):  # streaming: train/stream.py
            loader = stream_loader(self.train_dataset, self)
            if self.stream_position is not None:
                loader.load_state_dict(self.stream_position)
            return leave_signals_to_rank(loader)
        return leave_signals_to_rank(super().get_train_dataloader())

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        return leave_signals_to_rank(super().get_eval_dataloader(eval_dataset))

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """Resuming warns "missing keys: vocab_projector.weight" for a weight tied to the embeddings (safetensors
        stores it once; the Trainer's own exemption only covers ``_keys_to_ignore_on_save``): an expected case,
        so tied names are left out of the warning and the tie is restored."""
        tied = tied_parameter_names(self.model)
        if tied & set(load_result.missing_keys):
            self.model.tie_weights()
            load_result = load_result._replace(missing_keys=[k for k in load_result.missing_keys if k not in tied])
        super()._issue_warnings_after_load(load_result)


def tied_parameter_names(model: torch.nn.Module) -> set[str]:
    """Names of parameters that share their storage with another parameter (tied weights)."""
    owners: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(parameter), []).append(name)
    return {name for names in owners.values() if len(names) > 1 for name in names}


def write_report_safely(output_dir: Path) -> None:
    """The report is a convenience: failing to draw it must not fail a finished or preempted run."""
    try:
        from train.report import write_report  # plotting is imported only when a run ends

        write_report(output_dir)
    except ConfigError:
        return  # stopped before its first log step: nothing to draw yet
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
    # same results from the caches instead of repeating the work: each node's local rank 0 does it for its node,
    # unless the nodes share the cache, where world rank 0 does it for all.
    shared = cache_shared_with_rank_0(training)
    with training.main_process_first(local=not shared, desc="preparing data"):
        stream, raw = load_stream_raw(config) if job.streaming else (None, load_raw(config))
        arch = scratch_config(config)
        tokenizer = load_tokenizer(config, raw, from_scratch=arch is not None)
        if stream is not None:  # tokenized on the fly; only the bounded evaluation set is tokenized now
            held_out = {k: v for k, v in raw.splits.items() if k == "validation"}
            tokenized: dict[str, Any] = tokenize(config, RawData(DatasetDict(held_out), raw.fingerprint), tokenizer)
            tokenized["train"] = tokenized_stream(
                config, stream, tokenizer, training.process_index, training.world_size
            )
            # The Trainer would resume a stream by reading every batch up to the checkpoint; StreamPosition saves
            # where each rank stands instead. Real tokens are counted as they go by (a stream has no total).
            training.ignore_data_skip = True
            training.include_num_input_tokens_seen = "non_padding"  # even where it was turned off: no other count
        else:
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
        # StreamPosition before the marker: a checkpoint is complete once the streams' positions are in it.
        callbacks=[
            EpochForCollator(collator),
            *([StreamPosition()] if stream is not None else []),
            CheckpointCompleteMarker(resumed_options(config)),
        ],
    )
    # Both heads' MLM losses are means over the micro-batch and ignore num_items_in_batch; without this the Trainer
    # neither divides by gradient_accumulation_steps nor leaves the world size out (measured: accumulation 4 gave
    # a 4x gradient norm and logged loss).
    trainer.model_accepts_loss_kwargs = False
    streaming = stream is not None  # a stream's size and truncation are not known before it is read
    facts = {
        "dataset_fingerprint": raw.fingerprint,
        "train_samples": None if streaming else len(tokenized["train"]),
        "eval_samples": len(tokenized["validation"]) if "validation" in tokenized else 0,
        "train_real_tokens": None if streaming else real_token_count(tokenized["train"], tokenizer.pad_token_id),
        "truncation": None if streaming else truncation(tokenized["train"]),
        "tokenizer": tokenizer,
    }
    cut = facts["truncation"]
    if cut and cut["examples_cut"] and training.process_index == 0:
        kept = facts["train_real_tokens"]
        share = 100 * cut["tokens_cut"] / max(kept + cut["tokens_cut"], 1)
        warn(
            f"{cut['examples_cut']:,} of {facts['train_samples']:,} training examples are longer than "
            f"max_seq_length={job.max_seq_length} and were cut, dropping {cut['tokens_cut']:,} tokens ({share:.1f} % "
            "of the text): use padding packed, or a larger max_seq_length, to train on all of it"
        )
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


def disk_full(exc: BaseException, directory: Path) -> bool:
    """Whether ``exc`` (or what caused it) is a full device. The writers lose the errno on the way: torch.save
    says "file write failed" or "unexpected pos", safetensors names Rust's StorageFull; so for a failed write
    the device's free space decides."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    if any(isinstance(e, OSError) and e.errno == errno.ENOSPC for e in chain):
        return True
    text = " ".join(str(e) for e in chain)
    if any(marker in text for marker in ("No space left on device", "os error 28", "StorageFull")):
        return True
    try:
        writing = any(word in text for word in ("write", "inline_container", "serializ"))
        return writing and shutil.disk_usage(directory).free < LOW_SPACE_BYTES
    except OSError:
        return False


def apply_ddp_timeout(training: Any) -> None:
    """Give the CPU process group ``ddp_timeout``, as a GPU one gets it.

    TrainingArguments starts the process group while it is built, and passes ddp_timeout to accelerate only on
    the GPU path (transformers 5.24, ``_setup_devices``): with ``use_cpu`` gloo keeps its 30-minute default
    whatever MLM_DDP_TIMEOUT says. torch can change a started group's timeout (``_set_pg_timeout``)."""
    if training.use_cpu and dist.is_available() and dist.is_initialized():
        dist.distributed_c10d._set_pg_timeout(training.ddp_timeout_delta)


def main(argv: list[str] | None = None) -> int:
    config = load_config(sys.argv[1:] if argv is None else argv)
    apply_ddp_timeout(config.training)
    withhold_secrets(config, os.environ)
    output_dir = Path(config.training.output_dir)
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
    except UserError:
        raise
    except Exception as exc:
        if disk_full(exc, output_dir):  # a checkpoint or the final model did not fit; earlier ones are intact
            raise EnvironmentProblem(
                f"{config.source_of('output_dir')}={str(output_dir)!r}: no space left on the device while writing; "
                "earlier checkpoints are intact: free space or use a larger volume, then run again to resume"
            ) from None
        raise


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
    if training.world_size == local_world or not (dist.is_available() and dist.is_initialized()):
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


def agreed_resume(config: Config, is_zero: bool) -> str | None:
    """World rank 0 decides which checkpoint to resume from (and moves unusable ones aside); the others receive
    its answer, so ranks sharing a volume never race renaming the same directories."""
    if is_zero:
        start_over(config, warn)
    choice = [decide_resume(config, warn) if is_zero else None]
    if dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(choice, src=0)
    return choice[0]


def save_interrupted(trainer: Trainer) -> None:
    """A checkpoint of the current step, for a stop that came during an evaluation (the Trainer has no public
    way to save one outside its loop; every rank calls this, as the Trainer's own save needs)."""
    trainer._save_checkpoint(trainer.model_wrapped, trial=None)
    trainer.control = trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)


def train(config: Config) -> int:
    training = config.training
    logs.configure_console(config)
    started = now()
    output_dir = check_output_dir(config)
    check_cache_dir()
    handoff = Handoff.from_environ()
    is_zero = training.process_index == 0
    lease = OutputLease(output_dir, config.source_of("output_dir"))
    if is_zero:  # before anything in output_dir changes: a second job must leave the first unharmed
        lease.acquire(wait_s=config.job.stop_timeout)
    try:
        return run(config, output_dir, handoff, started, is_zero)
    finally:
        if is_zero:
            lease.release()


def run(config: Config, output_dir: Path, handoff: Handoff | None, started: str, is_zero: bool) -> int:
    training = config.training
    set_seed(training.seed)
    stopper = StopOnSignal()
    guard = DivergenceGuard()
    trainer, facts = build_trainer(config)
    logs.attach(trainer, config, facts, handoff)
    trainer.add_callback(stopper)
    trainer.add_callback(guard)
    resume = agreed_resume(config, is_zero)
    if resume and is_zero:
        warn(f"resuming from {resume}")
    if resume and config.job.streaming:
        trainer.stream_position = StreamPosition.load(
            resume, training.process_index, training.world_size, config.source_of("streaming")
        )
        if trainer.stream_position is None and is_zero:
            warn(f"{resume} holds no stream position (saved by a run without streaming): the stream starts over")

    def write_run_facts(status: str) -> None:
        if is_zero:
            facts_json = run_facts(
                config,
                world_size=training.world_size,
                dataset_fingerprint=facts["dataset_fingerprint"],
                truncation=facts["truncation"],
                started=started,
                status=status,
                handoff=handoff,
            )
            write_json_atomic(output_dir / "run.json", facts_json)
            write_report_safely(output_dir)

    metrics: dict[str, Any] = {}
    try:
        result = trainer.train(resume_from_checkpoint=resume)
        metrics.update(result.metrics)
        evaluating = trainer.eval_dataset is not None and training.eval_strategy != "no"  # no means none
        if evaluating and guard.step is None and not stopper.stopped:
            metrics.update(final_evaluation(trainer))
    except EvaluationInterrupted:
        if not stopper.stopped:  # stopped inside an evaluation: its step has no checkpoint yet
            save_interrupted(trainer)
        stopper.stopped = True
    if guard.step is not None or not finite_weights(trainer.model):
        write_run_facts("diverged")
        step = guard.step if guard.step is not None else trainer.state.global_step
        good, _ = newest_resumable(output_dir)
        kept = f"the last good checkpoint, {good.name}, is kept" if good else "no checkpoint was saved"
        raise ConfigError(
            f"training diverged at step {step} ({guard.what or 'the weights are not finite'}): final/ was not "
            f"written and {kept}; lower learning_rate (now {training.learning_rate:g}) or add warmup_steps, and "
            "start over with MLM_RESUME=never (a resumed optimizer keeps the old learning rate)"
        )
    if stopper.stopped:
        write_run_facts("preempted")
        raise Preempted(
            f"stopped by {stopper.signal_name} at step {trainer.state.global_step}; checkpoint saved in "
            f"{output_dir}; run the same command again to resume"
        )

    # Real (non-padding) tokens per second of this session: as the Trainer counted them (the default, and always
    # for a stream), else (counting turned off: nothing counted) samples per second times the real tokens of an
    # average sample.
    seen = trainer.state.num_input_tokens_seen - getattr(trainer, "_initial_num_input_tokens_seen", 0)
    if seen > 0 or facts["train_samples"] is None:
        runtime = metrics.get("train_runtime") or 0.0
        metrics["train_tokens_per_second"] = seen / runtime if runtime else 0.0
        metrics["num_input_tokens_seen"] = trainer.state.num_input_tokens_seen
    else:
        tokens_per_sample = facts["train_real_tokens"] / max(facts["train_samples"], 1)
        metrics["train_tokens_per_second"] = (
            metrics.get("train_samples_per_second", 0.0) * tokens_per_sample if metrics.get("train_runtime") else 0.0
        )
    if "eval_loss" in metrics:
        metrics["perplexity"] = math.exp(metrics["eval_loss"]) if metrics["eval_loss"] < 700 else math.inf
    metrics.update(
        world_size=training.world_size, train_samples=facts["train_samples"], eval_samples=facts["eval_samples"]
    )

    # Rank 0 writes every file; under DDP each rank holds the same weights, so the others have nothing to add.
    tokenizer = facts["tokenizer"]

    def write_model(directory: Path) -> None:
        trainer.save_model(str(directory))
        tokenizer.save_pretrained(str(directory))

    if is_zero:
        publish_final(output_dir, write_model)
        write_json_atomic(output_dir / "all_results.json", metrics)
        write_run_facts("finished")
        say(f"finished: model in {output_dir / 'final'}")
    # The other ranks wait for final/ here, not for the upload: a push of a large model outlasts ddp_timeout, and
    # a rank waiting in a collective that long would time out and fail a finished run.
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    if is_zero:
        # Once final/ and run.json are written: the hub push and the trackers' final model and facts (exit 3 when
        # one fails, final/ kept). Imported here: trackers are loaded only by a run that reaches this point.
        from train.publish import publish_run

        publish_run(config, output_dir, step=trainer.state.global_step)
    return 0


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    try:
        code = run_main(main)
    finally:
        cleanup()
    exit_process(code)
