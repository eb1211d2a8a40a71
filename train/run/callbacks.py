"""The Trainer callbacks the job adds besides logging and stopping on signals (train/run/preemption.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import TrainerCallback

from train.common import distributed
from train.common.console import now, warn
from train.common.handoff import Handoff
from train.common.phase import PhaseFacts
from train.config import Config, ResilienceArguments
from train.model.collator import MaskingCollator
from train.outputs.base import OutputLocation
from train.outputs.checkpoints import DATA_IDENTITY, RECIPE, resumed_options
from train.outputs.marker import digests_written_by, mark_complete
from train.outputs.record import recipe
from train.outputs.retention import Retention, rotate_directory
from train.outputs.runfiles import RunFiles, is_checkpoint_name, step_of
from train.run.branching import PHASE_KEY
from train.run.logs import append_record
from train.run.progress import ProgressReport
from train.run.rollback import Divergence
from train.run.saving import CheckpointWriter
from train.run.spikes import SERIES, SpikeRule

MIB = 2**20


class EpochForCollator(TrainerCallback):
    """Tells the collator the epoch before the epoch's dataloader iterator (and its workers) is created."""

    def __init__(self, collator: MaskingCollator) -> None:
        self.collator = collator

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.collator.epoch = int(state.epoch or 0)


class CheckpointCompleteMarker(TrainerCallback):
    """Records, in each checkpoint, when the Trainer finished saving it, the options it ran with (a resume compares
    them) and every file with its size and SHA-256 (a resume verifies them: train/outputs/checkpoints.py). Every
    rank calls on_save: each digests the files it wrote, world rank 0 gathers them (which also waits for every
    rank's files) and writes the marker - at once, or with background saves (``saves``: train/run/saving.py) behind
    the loop once the files are written. The gather, a collective, stays on the training thread either way.

    What a save costs is in train.jsonl: a ``checkpoint`` record per save with its size, the Trainer's save (from
    the step's end, or the evaluation's or log's before it, to on_save), the digests and marker after it
    (``make bench-checkpoints`` reads them), the time the loop waited (``save_blocking_s``) and the time written
    behind it (``save_background_s``: 0 for a synchronous save)."""

    def __init__(
        self,
        files: RunFiles,
        options: dict[str, Any],
        saves: CheckpointWriter | None = None,
        retention: Retention = Retention(None),
        progress: ProgressReport | None = None,
    ) -> None:
        self.files, self.options, self.saves, self.retention = files, options, saves, retention
        self.progress = progress
        self._mark = time.monotonic()

    @classmethod
    def of(
        cls,
        config: Config,
        files: RunFiles,
        identity: Any,
        phase: PhaseFacts | None,
        saves: CheckpointWriter | None,
        progress: ProgressReport | None = None,
    ) -> CheckpointCompleteMarker:
        """The job's marker: each checkpoint records the resolved options, the data's ``identity``, the ``phase``
        and the options the run set (its recipe, as run.json's); written behind the loop by ``saves``
        (train/run/saving.py), or at once when None; ``progress`` (the hang watchdog's: train/run/progress.py) is
        told when this rank waits for the others' digests and when it goes on saving. It takes the whole Config
        because a checkpoint records all of it."""
        resolved = config.as_dict(redact=True)
        recorded = {
            **resumed_options(resolved, config.training.world_size),
            DATA_IDENTITY: identity,
            PHASE_KEY: phase.index if phase else None,
            RECIPE: recipe(resolved, config.sources, Handoff.from_environ()),  # what a branch of it starts from
        }
        return cls(files, recorded, saves, retention_of(config), progress)

    def _since(self, *_: Any, **__: Any) -> None:
        self._mark = time.monotonic()

    on_step_end = on_evaluate = on_log = _since  # the Trainer saves after these, at the same step

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        saved = time.monotonic()
        checkpoint, rank = self.files.checkpoint(state.global_step), distributed.world_rank()
        mine = digests_written_by(checkpoint, rank) if rank and checkpoint.is_dir() else {}
        if self.progress is not None:
            self.progress.waiting(state.global_step)
        everyone = distributed.gather_from_every_rank(mine)
        if self.progress is not None:
            self.progress.saving(state.global_step)
        if state.is_world_process_zero and checkpoint.is_dir():
            others = {n: d for found in everyone for n, d in found.items()}
            record = {"event": "checkpoint", "step": state.global_step, "save_s": round(saved - self._mark, 3)}
            listed: dict[str, dict[str, Any]] = {}

            protect = protected_steps(state)

            def mark() -> None:
                started = time.monotonic()
                listed.update(mark_complete(checkpoint, self.options, others))
                record["digest_s"] = round(time.monotonic() - started, 3)
                rotate_directory(self.files, self.retention, protect)  # once this one is complete, never before

            def done(background_s: float) -> None:
                self._record(record, listed, blocking_s, background_s)

            blocking_s = time.monotonic() - self._mark  # the loop's wait, with background saves: to here
            if self.saves is None or not self.saves.start(state.global_step, mark, done):
                mark()
                blocking_s = time.monotonic() - self._mark  # a synchronous save's: its digests and marker too
                done(0.0)
        self._mark = time.monotonic()

    def _record(
        self, record: dict[str, Any], listed: dict[str, dict[str, Any]], blocking_s: float, background_s: float
    ) -> None:
        """A save's ``checkpoint`` record, once it is marked complete."""
        append_record(
            self.files.root,
            {
                **record,
                "time": now(),
                "files": len(listed),
                "mib": round(sum(d["size"] for d in listed.values()) / MIB, 1),
                "save_blocking_s": round(blocking_s, 3),
                "save_background_s": round(background_s, 3),
            },
        )


class CheckpointSaved(TrainerCallback):
    """Hands each saved checkpoint to the output location (a bucket uploads it and rotates its copies). Added
    after every callback that writes into a checkpoint: the completeness marker and the stream position are in
    it by then."""

    def __init__(self, location: OutputLocation, retention: Retention) -> None:
        self.location, self.retention = location, retention

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.location.checkpoint_saved(state.global_step, self.retention, protected_steps(state))


def retention_of(config: Config) -> Retention:
    """The run's checkpoint retention (train/outputs/retention.py): save_total_limit and save_keep_every."""
    return Retention(config.training.save_total_limit, config.checkpoint.save_keep_every)


def protected_steps(state: Any) -> list[int]:
    """The checkpoints rotation keeps whatever the rule: the best model's (load_best_model_at_end reads it back)."""
    best = state.best_model_checkpoint
    return [step_of(Path(best))] if best and is_checkpoint_name(Path(best).name) else []


def finite_weights(model: torch.nn.Module) -> bool:
    """Whether every floating weight is finite, the same answer on every rank: under fsdp a rank holds only its
    shard (``bool()`` of a DTensor reads the local value, so ranks could disagree and hang apart), so the answers
    are agreed with a MIN (a collective, as the save it precedes)."""
    parameters = [p for p in model.parameters() if p.is_floating_point()]
    local = [p.to_local() if isinstance(p, DTensor) else p for p in parameters]
    finite = all(bool(torch.isfinite(p).all()) for p in local)
    if len(local) == 0 or not isinstance(parameters[0], DTensor):
        return finite
    agreed = torch.tensor(int(finite), device=local[0].device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    return bool(agreed.item())


class DivergenceGuard(TrainerCallback):
    """Stops the run when the loss, the gradient norm or the weights stop being finite, before a checkpoint of
    diverged weights is written, and when a logged loss or gradient norm spikes (train/run/spikes.py's rule;
    ``stop_on_spike`` False: a spike is only said). The job then rolls back (train/run/rollback.py) or publishes
    nothing (exit 2).

    What the Trainer lacks: it trains on with a NaN loss, saves NaN weights and ends with exit 0. The logged loss
    is the mean over the logging window, so one NaN step shows there (its gradient norm too, where
    logging_nan_inf_filter hides the loss); the weights are checked before each save. Every rank sees the same
    logged values (the loss is gathered, DDP's gradients are reduced), and the verdict is agreed all the same (a
    MAX over the ranks), so that every rank stops at the same step whatever one of them saw."""

    def __init__(self, rule: SpikeRule | None = None, stop_on_spike: bool = True, unavailable: str = "") -> None:
        self.rule = rule or SpikeRule(threshold=0.0)
        self.stop_on_spike = stop_on_spike
        self.unavailable = unavailable  # why this run cannot roll back (train/run/rollback.py), "" where it can
        self.seen: Divergence | None = None
        self.healthy = 0  # the last step whose log was judged healthy
        self.spikes_said: list[dict[str, Any]] = []  # spikes seen where they do not stop the run
        self.rollbacks = 0  # the rollbacks made (rearm's count)

    @classmethod
    def of(cls, resilience: ResilienceArguments, unavailable: str, max_grad_norm: float = 0.0) -> DivergenceGuard:
        """The job's guard: spikes by spike_threshold (a gradient norm's only without clipping: ``max_grad_norm``
        0), stopping the run where it can roll back (``unavailable`` empty and spike_rollbacks above 0)."""
        rolls_back = resilience.spike_rollbacks > 0 and not unavailable
        clipped = bool(max_grad_norm and max_grad_norm > 0)
        return cls(SpikeRule(resilience.spike_threshold, clipped=clipped), rolls_back, unavailable)

    @property
    def step(self) -> int | None:
        return self.seen.step if self.seen else None

    @property
    def what(self) -> str:
        return self.seen.what if self.seen else ""

    def rearm(self) -> None:
        """After a rollback: the next divergence is a new one."""
        self.seen = None
        self.rollbacks += 1

    def _diverged(self, state: Any, control: Any, kind: str, what: str) -> None:
        if self.seen is None:
            self.seen = Divergence(state.global_step, kind, what, self.healthy)
        control.should_save = control.should_evaluate = False
        control.should_training_stop = True

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if control.should_save and model is not None and not finite_weights(model):
            self._diverged(state, control, NON_FINITE, "the weights are not finite")

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        logged = logs or {}
        if not any(key in logged for key in SERIES):  # an evaluation's or the end's record
            return
        verdict = self.rule.judge(logged)
        kind, what = verdict or ("", "")
        agreed = agreed_verdict(VERDICTS.index(kind))
        if agreed and not what:
            kind, what = VERDICTS[agreed], f"another rank saw a {VERDICTS[agreed]} value"
        if kind == NON_FINITE or (kind == SPIKE and self.stop_on_spike):
            self._diverged(state, control, kind, what)
        elif kind == SPIKE:
            self.spikes_said.append({"step": state.global_step, "what": what})
            if distributed.is_world_zero():
                warn(f"a spike at step {state.global_step}: {what} (no rollback: training on)")
        else:
            self.healthy = state.global_step


NON_FINITE, SPIKE = "non-finite", "spike"
VERDICTS = ("", SPIKE, NON_FINITE)  # in order of weight: the ranks agree on the heaviest


def agreed_verdict(mine: int) -> int:
    """The heaviest of the ranks' verdicts (an index into VERDICTS): a MAX over the ranks, a collective every rank
    calls at the same log."""
    if not distributed.initialized():
        return mine
    backend_device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor(mine, device=backend_device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())
