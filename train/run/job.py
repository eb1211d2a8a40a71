"""The per-rank program torchrun starts: prepare (train/run/build.py), train, and end as a finished, stopped or
diverged run; world rank 0 writes the run's files.

Run as ``python -m train.run.job [--option value ...]`` under torchrun (the launcher builds that command). It reads
the same configuration as the launcher, plus the launcher's decisions appended as CLI flags and the facts of them
it shows (``MLM_LAUNCH``, train/common/handoff.py).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch.distributed as dist
from transformers import set_seed

from train.common import distributed
from train.common.console import now, say, warn
from train.common.errors import (
    EXIT_CRASH,
    ConfigError,
    EnvironmentProblem,
    Preempted,
    UserError,
    exit_process,
    first_line,
    run_main,
)
from train.common.handoff import Handoff
from train.common.lifetime import end_children
from train.config import Config, load_config, move_hub_token_to_env
from train.data import StreamPosition
from train.outputs.checkpoints import decide_resume, newest_resumable
from train.outputs.lease import OutputLease
from train.outputs.local import (
    RunRecord,
    check_cache_dir,
    check_output_dir,
    disk_full,
    publish_final,
    start_over,
    write_json_atomic,
)
from train.outputs.mirror import Mirror, UploadCheckpoints
from train.outputs.runfiles import RunFiles
from train.run import crash, logs
from train.run.build import Prepared, prepare
from train.run.callbacks import finite_weights
from train.run.outcome import divergence_message, evaluation_at, final_metrics
from train.run.preemption import EvaluationInterrupted
from train.run.trainer import apply_ddp_timeout, save_interrupted, tokens_seen_this_session


def main(argv: list[str] | None = None) -> int:
    config = load_config(sys.argv[1:] if argv is None else argv)
    apply_ddp_timeout(config.training)
    move_hub_token_to_env(config, os.environ)
    try:
        return run(config)
    except dist.DistBackendError as exc:
        # Another rank died (a node lost, killed or preempted without a checkpoint) or stopped answering: say so in
        # one line, and exit 1 (a crash, worth retrying) rather than the 2/3 that tell Kubernetes not to retry.
        raise timed_out(config, exc) or UserError(
            f"lost contact with another rank ({first_line(exc)}): a node or process failed; check its logs",
            exit_code=EXIT_CRASH,
        ) from exc
    except UserError:
        raise
    except Exception as exc:
        files = RunFiles(config.training.output_dir)
        if disk_full(exc, files.root):  # a checkpoint or the final model did not fit; earlier ones are intact
            raise EnvironmentProblem(
                f"{config.source_of('output_dir')}={str(files.root)!r}: no space left on the device while writing; "
                "earlier checkpoints are intact: free space or use a larger volume, then run again to resume"
            ) from None
        found = timed_out(config, exc) or crash.worker_death(exc)
        if found is None:
            found = crash.unexpected(exc, files, distributed.world_rank())
            if config.output_store:  # the pod, and its staging directory, may be gone before anyone reads it
                from train.outputs.mirror import upload_crash_log

                upload_crash_log(config, files.crash_log(distributed.world_rank()))
        raise found from exc
    finally:
        end_children()  # workers that ignore SIGTERM must not hold the rank's exit (train/common/lifetime.py)


def timed_out(config: Config, exc: BaseException) -> UserError | None:
    return crash.collective_timeout(exc, config.source_of("ddp_timeout"), config.training.ddp_timeout)


def run(config: Config) -> int:
    """Check the outputs, hold the lease (world rank 0), train, and write what the run amounts to."""
    logs.configure_console(config)
    started = now()
    files = check_output_dir(config)
    check_cache_dir()
    handoff = Handoff.from_environ()
    mirror = Mirror.of(config)  # None for a directory
    lease = mirror.lease() if mirror else OutputLease(files, config.source_of("output_dir"))
    if distributed.is_world_zero():  # before output_dir changes: a second job must leave the first unharmed
        lease.acquire(wait_s=config.job.stop_timeout)
    try:
        set_seed(config.training.seed)
        prepared = prepare(config, lambda: agreed_resume(config, mirror))
        resume = prepared.resume
        logs.attach(prepared.trainer, config, prepared.facts(), handoff)
        prepared.trainer.add_callback(prepared.stopper)
        prepared.trainer.add_callback(prepared.guard)
        if mirror:  # after every callback that writes into a checkpoint
            prepared.trainer.add_callback(UploadCheckpoints(mirror))
        uploaded = mirror.upload_run_files if mirror else None
        record = RunRecord(config, files, prepared.facts(), handoff, started, uploaded)
        take_stream_position(config, prepared, resume)
        metrics = train(config, prepared, resume)
        end_if_diverged_or_stopped(config, prepared, record)
        finish(config, prepared, record, metrics, mirror)
        return 0
    finally:
        if distributed.is_world_zero():
            lease.release()


def agreed_resume(config: Config, mirror: Mirror | None = None) -> str | None:
    """World rank 0 decides which checkpoint to resume from (and moves unusable ones aside); the others receive
    its answer, so ranks sharing a volume never race renaming the same directories. With a store, rank 0 chooses
    there and every node downloads the choice into its staging directory."""
    is_zero = distributed.is_world_zero()
    choice: list[str | None] = [None]
    if is_zero and mirror:
        choice = [mirror.start(warn)]
    elif is_zero:
        start_over(config, warn)
        choice = [decide_resume(config, warn)]
    if distributed.initialized():
        dist.broadcast_object_list(choice, src=0)
    resume = choice[0]
    if mirror:
        resume = mirror.fetch(resume)
        distributed.barrier()
    if resume and is_zero:
        warn(f"resuming from {resume}")
    return resume


def take_stream_position(config: Config, prepared: Prepared, resume: str | None) -> None:
    """A streamed corpus's ranks each take their saved position in it."""
    is_zero = distributed.is_world_zero()
    if resume and prepared.corpus.streaming:
        training = config.training
        label = config.source_of("streaming")
        position = StreamPosition.load(resume, training.process_index, training.world_size, label)
        prepared.trainer.stream_position = position
        if position is None and is_zero:
            warn(f"{resume} holds no stream position (saved by a run without streaming): the stream starts over")


def train(config: Config, prepared: Prepared, resume: str | None) -> dict[str, Any]:
    """Train (from ``resume``), then evaluate the final weights unless the run stopped or diverged; a stop during
    an evaluation saves the step it came at."""
    trainer, stopper, guard = prepared.trainer, prepared.stopper, prepared.guard
    metrics: dict[str, Any] = {}
    try:
        metrics.update(trainer.train(resume_from_checkpoint=resume).metrics)
        evaluating = trainer.eval_dataset is not None and config.training.eval_strategy != "no"  # no means none
        if evaluating and guard.step is None and not stopper.stopped:
            step = trainer.state.global_step
            metrics.update(evaluation_at(trainer.state.log_history, step) or trainer.evaluate())
    except EvaluationInterrupted:
        if not stopper.stopped:  # stopped inside an evaluation: its step has no checkpoint yet
            save_interrupted(trainer)
        stopper.stopped = True
    return metrics


def end_if_diverged_or_stopped(config: Config, prepared: Prepared, record: RunRecord) -> None:
    """A diverged run publishes nothing (exit 2); a stopped one has saved its checkpoint (exit 75)."""
    trainer, guard = prepared.trainer, prepared.guard
    if guard.step is not None or not finite_weights(trainer.model):
        record.write("diverged")
        good, _ = newest_resumable(record.files)
        step = guard.step if guard.step is not None else trainer.state.global_step
        what = guard.what or "the weights are not finite"
        raise ConfigError(divergence_message(step, what, good.name if good else None, config.training.learning_rate))
    if prepared.stopper.stopped:
        record.write("preempted")
        raise Preempted(
            f"stopped by {prepared.stopper.signal_name} at step {trainer.state.global_step}; checkpoint saved in "
            f"{record.files.root}; run the same command again to resume"
        )


def finish(
    config: Config, prepared: Prepared, record: RunRecord, metrics: dict[str, Any], mirror: Mirror | None = None
) -> None:
    """World rank 0 writes final/, all_results.json and run.json (and uploads them to a store), then pushes and
    logs to the trackers."""
    files = record.files
    if distributed.is_world_zero():
        publish_final(files, prepared.write_model)
        trainer, corpus = prepared.trainer, prepared.corpus
        results = final_metrics(
            metrics,
            tokens_this_session=tokens_seen_this_session(trainer),
            tokens_in_all=trainer.state.num_input_tokens_seen,
            corpus=corpus,
            world_size=config.training.world_size,
        )
        write_json_atomic(files.all_results, results)
        if mirror:  # final/ before run.json says "finished"
            mirror.publish()
        record.write("finished")
        say(f"finished: model in {mirror.final_url if mirror else files.final}")
    # The other ranks wait for final/ here, not for the upload: a push of a large model outlasts ddp_timeout, and
    # a rank waiting in a collective that long would time out and fail a finished run.
    distributed.barrier()
    if distributed.is_world_zero():
        # Once final/ and run.json are written: the hub push and the trackers' final model and facts (exit 3 when
        # one fails, final/ kept). Imported here: trackers are loaded only by a run that reaches this point.
        from train.publish import CARD, publish_run

        try:
            publish_run(config, files, step=prepared.trainer.state.global_step)
        finally:
            if mirror and (files.final / CARD).is_file():  # the model card the push or MLflow wrote into final/
                mirror.store.upload(files.root, files.final.relative_to(files.root) / CARD)


def cleanup() -> None:
    if distributed.initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    try:
        code = run_main(main)
    finally:
        cleanup()
    exit_process(code)
