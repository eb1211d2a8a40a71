"""The per-rank program torchrun starts: prepare (train/run/build.py), train, and end as a finished, stopped or
diverged run; world rank 0 writes the run's files.

Run as ``python -m train.run.job [--option value ...]`` under torchrun (the launcher builds that command). It reads
the same configuration as the launcher, plus the launcher's decisions appended as CLI flags and the facts of them
it shows (``MLM_LAUNCH``, train/common/handoff.py).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch.distributed as dist
from transformers import TrainingArguments, set_seed

from train.common import distributed
from train.common.console import now, say, warn
from train.common.errors import (
    EXIT_CRASH,
    EXIT_PREEMPTED,
    ConfigError,
    EnvironmentProblem,
    Preempted,
    UserError,
    first_line,
    record_exit_code,
)
from train.common.handoff import Handoff, global_batch
from train.common.lifetime import end_children
from train.common.writable import check_cache_dir, disk_full
from train.config import Config, DataArguments, ResilienceArguments, load_config, move_hub_token_to_env
from train.config.resilience import parse_faults
from train.data import no_training_example
from train.outputs.base import OutputLocation
from train.outputs.checkpoints import newest_resumable, planned_steps
from train.outputs.location import output_location
from train.outputs.record import RecordHooks, RunRecord, write_json_atomic
from train.outputs.runfiles import CUT_SHORT, RunFiles, step_of
from train.publish import CARD, publish_run
from train.run import crash, logs
from train.run.banner import banner
from train.run.budget_stop import CutShort
from train.run.build import Prepared, prepare
from train.run.callbacks import CheckpointSaved, finite_weights, retention_of
from train.run.drills import FaultDrill
from train.run.outcome import divergence_message, evaluation_at, final_metrics, session_rates, write_report_safely
from train.run.preemption import EvaluationInterrupted
from train.run.rollback import Rollbacks
from train.run.startup import Startup
from train.run.trainer import apply_ddp_timeout, tokens_seen_this_session


def main(argv: list[str] | None = None) -> int:
    startup = Startup.begin()
    config = load_config(sys.argv[1:] if argv is None else argv)
    apply_ddp_timeout(config.training)
    move_hub_token_to_env(config, os.environ)
    location = output_location(config)
    try:
        return run(config, location, startup)
    except dist.DistBackendError as exc:
        # Another rank died (a node lost, killed or preempted without a checkpoint) or stopped answering: say so in
        # one line, and exit 1 (a crash, worth retrying) rather than the 2/3 that tell Kubernetes not to retry.
        raise timed_out(exc, config.training, config.sources) or UserError(
            f"lost contact with another rank ({first_line(exc)}): a node or process failed; check its logs",
            exit_code=EXIT_CRASH,
        ) from exc
    except UserError:
        raise
    except Exception as exc:
        files = location.files
        if disk_full(exc, files.root):  # a checkpoint or the final model did not fit; earlier ones are intact
            raise EnvironmentProblem(
                f"{config.source_of('output_dir')}={str(files.root)!r}: no space left on the device while writing; "
                "earlier checkpoints are intact: free space or use a larger volume, then run again to resume"
            ) from None
        found = timed_out(exc, config.training, config.sources) or crash.worker_death(exc)
        if found is None:
            found = crash.unexpected(exc, files, distributed.world_rank())
            # In a bucket: the pod, and its staging directory, may be gone before anyone reads it.
            location.keep_crash_log(files.crash_log(distributed.world_rank()))
        raise found from exc
    finally:
        end_children()  # workers that ignore SIGTERM must not hold the rank's exit (train/common/lifetime.py)


def timed_out(exc: BaseException, training: TrainingArguments, sources: Mapping[str, str]) -> UserError | None:
    """A collective another rank never joined within ddp_timeout (named as it was set), or None."""
    return crash.collective_timeout(exc, sources.get("ddp_timeout", "ddp_timeout"), training.ddp_timeout)


PHASE_ENDED = "phase ended"  # run.json's status between two phases of a phased run


def run(config: Config, location: OutputLocation, startup: Startup | None = None) -> int:
    """Check the outputs (unless this node's launcher did), hold the lease (world rank 0), train, and write what
    the run amounts to. ``startup``: where the start-up goes (train/run/startup.py), from ``main``'s start. It takes
    the whole Config because it assembles the run: the rank's preparation, the banner, the run's record and its
    end."""
    log_format = logs.configure_console(config.launch.log_format)
    started = now()
    handoff = Handoff.from_environ()
    startup = startup or Startup.begin()
    startup.launched_at = handoff.launched_at if handoff is not None else None
    if handoff is None or not handoff.outputs_checked:  # a bare torchrun: nobody checked them yet
        location.check()
        check_cache_dir()
    files = location.files
    lease = location.lease()
    if distributed.is_world_zero():  # before output_dir changes: a second job must leave the first unharmed
        lease.acquire(wait_s=config.launch.stop_timeout)
    startup.mark("configuration")  # the options, the output directory's check and the lease
    try:
        set_seed(config.training.seed)
        prepared = prepare(config, files, lambda: agreed_resume(location), startup)
        resume = prepared.resume
        facts = prepared.facts(outputs=location.summary())
        shown = functools.partial(banner, config, facts, handoff)  # the banner, once the Trainer says where it starts
        log = logs.attach(prepared.trainer, logs.callbacks(config.training, log_format, facts, handoff, startup, shown))
        prepared.trainer.add_callback(prepared.stopper)
        prepared.trainer.add_callback(prepared.guard)
        drill = fault_drill(config.resilience, files)
        if drill is not None:
            prepared.trainer.add_callback(drill)
        prepared.trainer.add_callback(CheckpointSaved(location, retention_of(config)))  # after every writer
        budget = prepared.budget
        if budget is not None:  # last: a save's time includes its digests and upload
            budget.resumed_total = planned_steps(resume)
            prepared.trainer.add_callback(budget)
        progress = prepared.progress
        if progress is not None:  # after every other: it reads the save and evaluation they asked for
            prepared.trainer.add_callback(progress)
        after = [lambda: write_report_safely(files), lambda: location.sync(*files.record_files())]
        settings = prepared.trainer.settings
        resilience = config.resilience
        rollbacks = Rollbacks(
            resilience.spike_rollbacks, files, settings.skip, settings.saves, prepared.guard.unavailable,
            resilience.spike_lr_factor,
        )  # fmt: skip
        live: list[Callable[[], dict[str, Any]]] = [
            lambda: {"quality_curve": log.curve, "rollbacks": rollbacks.record()},
            lambda: {"spikes_said": prepared.guard.spikes_said, "fault_drill": drill.facts() if drill else None},
            lambda: {"stragglers": prepared.trainer.stragglers.record()},
        ]
        if budget is not None:
            live.append(lambda: {"time_budget": budget.plan.record()})
        record = RunRecord(config, files, facts, handoff, started, RecordHooks(after, live))
        metrics = train(config.training, prepared, resume, rollbacks)
        end_if_diverged(prepared, record, config.training.learning_rate, rollbacks.refusal)
        end_if_nothing_trained(config.data, prepared, record, resume)
        cut = budget.cut if budget is not None else None  # a budgeted run's stop, and the steps after its checkpoint
        if prepared.stopper.stopped and not (cut and cut.whole_plan):
            if cut is not None:  # a budgeted run went on to a decayed model: published first, as a stopped run's
                finish(config, prepared, record, metrics, location, cut)
            end_stopped(prepared, record, metrics, location, cut)
        if prepared.phase is not None and not prepared.phase.last:
            end_phase(prepared, record, location)
            # Its checkpoint is saved and the next phase starts from it. A stop signal landing from here to the exit
            # makes torchrun exit 1 whatever the ranks did: 75 tells the launcher to stop the plan there (run again,
            # the next phase starts), neither a crash nor a start of the next phase. torchrun's 0 wins otherwise.
            record_exit_code(EXIT_PREEMPTED)
            return 0
        finish(config, prepared, record, metrics, location)
        # Finished: said to the launcher whatever comes next. A stop signal may land from here to the exit (the
        # plan's end fitted the stop's window, or a pod deleted as its run ends); torchrun, signalled, exits 1
        # whatever its ranks did, and the launcher must not call a finished run a crash.
        record_exit_code(0)
        return 0
    finally:
        if distributed.is_world_zero():
            lease.release()


def agreed_resume(location: OutputLocation) -> str | None:
    """World rank 0 decides which checkpoint to resume from (and sets unusable ones aside); the others receive
    its answer, so ranks sharing a volume never race renaming the same directories. Each rank then has it on
    its node (from a bucket, every node downloads the choice into its staging directory)."""
    choice: list[str | None] = [None]
    if distributed.is_world_zero():
        choice = [location.choose_resume(warn)]
    if distributed.initialized():
        dist.broadcast_object_list(choice, src=0)
    resume = location.localize(choice[0])
    distributed.barrier()
    if resume and distributed.is_world_zero():
        say(f"resuming from {resume}")
    return resume


def train(training: TrainingArguments, prepared: Prepared, resume: str | None, rollbacks: Rollbacks) -> dict[str, Any]:
    """Train (from ``resume``), then evaluate the final weights unless the run stopped or diverged; a stop during
    an evaluation saves the step it came at. A divergence or spike the guard stopped at is rolled back while
    ``rollbacks`` allows: trained again from the checkpoint it chose, through the Trainer's own resume, the batches
    that led into it skipped (train/run/rollback.py). The end of training waits for a checkpoint written in the
    background (train/run/saving.py), and so does a failure's exit."""
    trainer, stopper, guard = prepared.trainer, prepared.stopper, prepared.guard
    metrics: dict[str, Any] = {}
    start = step_of(Path(resume)) if resume else 0
    try:
        result = trainer.train(resume_from_checkpoint=resume)
        while guard.seen is not None and not stopper.stopped:
            back = rollbacks.back_from(guard.seen, training.gradient_accumulation_steps)
            if back is None:
                break
            guard.rearm()
            start = step_of(Path(back))
            result = trainer.train(resume_from_checkpoint=back)
        metrics.update(result.metrics)
        end = trainer.state.global_step
        batch = global_batch(
            training.per_device_train_batch_size, training.world_size, training.gradient_accumulation_steps
        )
        metrics.update(
            session_rates(metrics, full_steps=trainer.steps_cost(start, end), steps=end - start, global_batch=batch)
        )
        evaluating = trainer.eval_dataset is not None and training.eval_strategy != "no"  # no means none
        # a stop ends without it, unless the budget let the run go on to a final model (train/run/budget.py)
        if evaluating and guard.step is None and (not stopper.stopped or stopper.finishing):
            step = trainer.state.global_step
            metrics.update(evaluation_at(trainer.state.log_history, step) or trainer.evaluate())
    except EvaluationInterrupted:
        # The Trainer's loop is left: the save below is the stop's, with no steps after it (a time budget's window
        # would be recorded, and final/ claimed, for steps that never run).
        stopper.interrupted_evaluation = True
        if not stopper.stopped:  # stopped inside an evaluation: its step has no checkpoint yet
            trainer.save_interrupted()
        stopper.stopped = True
    except BaseException:
        if trainer.settings.saves is not None:  # the exit waits for the checkpoint written in the background
            trainer.settings.saves.close()
        raise
    return metrics


def end_if_diverged(prepared: Prepared, record: RunRecord, learning_rate: float, refusal: str = "") -> None:
    """A diverged run publishes nothing (exit 2); its words suggest a lower rate than ``learning_rate``, and say why
    it was not rolled back (``refusal``: train/run/rollback.py)."""
    trainer, guard = prepared.trainer, prepared.guard
    if guard.step is not None or not finite_weights(trainer.model):
        record.write("diverged")
        good, _ = newest_resumable(record.files)
        step = guard.step if guard.step is not None else trainer.state.global_step
        what = guard.what or "the weights are not finite"
        raise ConfigError(divergence_message(step, what, good.name if good else None, learning_rate, refusal))


def end_if_nothing_trained(data: DataArguments, prepared: Prepared, record: RunRecord, resume: str | None) -> None:
    """A stream that gave no training example is exit 2, not an untrained model published as finished: the
    Trainer only warns and ends the epoch (transformers 5.25). check_stream_parts refuses a stream that has
    nothing for some rank before training, reading each part from its start; this stays for a resumed run, which
    reads on from where its checkpoint's stream stopped."""
    trainer, start = prepared.trainer, step_of(Path(resume)) if resume else 0
    if not prepared.corpus.streaming or prepared.stopper.stopped or trainer.state.global_step > start:
        return
    record.write("failed")
    raise no_training_example(data, [0], 1)


def end_stopped(
    prepared: Prepared, record: RunRecord, metrics: dict[str, Any], location: OutputLocation, cut: CutShort | None
) -> None:
    """A stopped run has saved its checkpoint (exit 75); a budgeted one that went on to a decayed model (``cut``)
    has published it before, marked as a stopped run's (a rerun resumes the checkpoint and replaces it)."""
    step = cut.at_step if cut else prepared.trainer.state.global_step
    saved = f"checkpoint saved as {record.files.checkpoint(step).name} in {location.shown}"
    if cut is None:
        record.write("preempted")
    else:
        loss = metrics.get("eval_loss")
        judged = f", eval_loss {loss:.4f}" if isinstance(loss, float) else ""
        saved += (
            f"; {cut.steps} more steps decayed the learning rate and {location.final_shown} holds that model (step "
            f"{cut.final_step}{judged}), a stopped run's"
        )
    raise Preempted(
        f"stopped by {prepared.stopper.signal_name} at step {step}; {saved}; run the same command again to resume"
    )


def end_phase(prepared: Prepared, record: RunRecord, location: OutputLocation) -> None:
    """A phase that is not the last: its last checkpoint (saved at its end: train/run/branching.py PhaseEnd) is
    where the next phase starts; no final/ yet, and run.json says which phase ended."""
    phase = prepared.phase
    if phase is None:
        return
    record.write(PHASE_ENDED)
    distributed.barrier()
    if distributed.is_world_zero():
        say(f"{phase.line()}: ended; {record.files.checkpoint(phase.end).name} in {location.shown} starts the next")


def finish(
    config: Config,
    prepared: Prepared,
    record: RunRecord,
    metrics: dict[str, Any],
    location: OutputLocation,
    cut: CutShort | None = None,
) -> None:
    """World rank 0 publishes final/, then writes all_results.json and run.json, then pushes and logs to the
    trackers; a stopped run's model (``cut``) is marked as such in final/, and is neither pushed nor logged: the
    stop's window is short, and a rerun finishes the run. It takes the whole Config because it hands it on to the
    push and the trackers (train/publish)."""
    files = record.files
    record.measured_sharding = prepared.sharding_facts()  # collectives: every rank, before rank 0 goes on alone
    prepared.trainer.gather_for_save()
    if distributed.is_world_zero():
        write = prepared.write_model if cut is None else functools.partial(write_cut_short, prepared.write_model, cut)
        location.publish(write)  # final/ whole before run.json says "finished"
        trainer, corpus = prepared.trainer, prepared.corpus
        results = final_metrics(
            metrics,
            tokens_this_session=tokens_seen_this_session(trainer),
            tokens_in_all=trainer.state.num_input_tokens_seen,
            corpus=corpus,
            world_size=config.training.world_size,
        )
        write_json_atomic(files.all_results, results)
        record.write("finished" if cut is None else "preempted")
        if cut is None:
            say(f"finished: model in {location.final_shown}{rolled_back(prepared.guard.rollbacks)}")
    # The other ranks wait for final/ here, not for the upload: a push of a large model outlasts ddp_timeout, and
    # a rank waiting in a collective that long would time out and fail a finished run.
    distributed.barrier()
    if distributed.is_world_zero() and cut is None:
        # Once final/ and run.json are written: the hub push and the trackers' final model and facts (exit 3 when
        # one fails, final/ kept).
        try:
            publish_run(config, files, step=prepared.trainer.state.global_step)
        finally:
            location.sync(files.final / CARD)  # the model card the push or MLflow wrote into final/


def rolled_back(count: int) -> str:
    """What the finished line adds for a run that rolled back (run.json's rollbacks says where and why)."""
    return f", after {count} rollback{'s' if count != 1 else ''} (run.json: rollbacks)" if count else ""


def fault_drill(resilience: ResilienceArguments, files: RunFiles) -> FaultDrill | None:
    """The fault drill inject_fault names (train/run/drills.py), or None."""
    faults = parse_faults(resilience.inject_fault)
    return FaultDrill(faults, files.faults_fired) if faults else None


def write_cut_short(write_model: Callable[[Path], None], cut: CutShort, final: Path) -> None:
    """The model, and the stop it came from (train/outputs/runfiles.py's CUT_SHORT)."""
    write_model(final)
    write_json_atomic(final / CUT_SHORT, cut.record())


if __name__ == "__main__":
    distributed.run_and_exit(main)
