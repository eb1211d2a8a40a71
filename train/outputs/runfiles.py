"""Every name in a run's output_dir, in one place: what the job writes there and what report, publish, doctor and
the benchmark read back. Pure paths: nothing here touches the filesystem except :meth:`RunFiles.checkpoints`,
which lists the checkpoint directories (their validation and the resume choice are train/outputs/checkpoints.py).

    output_dir/
      final/                the finished model (written as .final.tmp/, renamed into place: train/outputs/local.py)
      final/cut_short.json  only in the model of a stopped budgeted run (train/run/budget.py): not finished, a
                            rerun resumes its checkpoint and replaces final/
      final.previous/       a finished model being replaced by a run started over (MLM_OVERWRITE_OUTPUT_DIR)
      checkpoint-N/         the Trainer's checkpoints, each with .complete, mlm_options.json and, for a stream,
                            stream_state.json
      run.json              what ran (options redacted, versions, hardware, status)
      branch.json           a branch's parent checkpoint and step (train/outputs/branch.py)
      all_results.json      the finished run's metrics
      finetune_results.json a downstream score (train/commands/finetune/), or a series over the run's checkpoints
      logs/train.jsonl      one JSON record per log step
      logs/crash-rank-N.txt the traceback of rank N's crash (its console has one line)
      report.html, loss.png the report
      .lease                the one-job-per-output-dir lease
      .invalid-checkpoint-N-PID/  a checkpoint a resume could not use, moved aside for a post-mortem
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CHECKPOINT_PREFIX = "checkpoint-"
FINETUNE_RESULTS = "finetune_results.json"  # written by ./entrypoint.sh finetune where its output_dir is
ASIDE_PREFIX = ".invalid-"  # a checkpoint moved aside: .invalid-checkpoint-15-<pid>
# Inside a checkpoint (the Trainer's own files besides):
COMPLETE_MARKER = ".complete"  # written once the Trainer's on_save has run
OPTIONS_NAME = "mlm_options.json"  # the resolved options (redacted) of the run that wrote the checkpoint
STREAM_STATE = "stream_state.json"  # every rank's position in a streamed corpus
TRAINER_STATE = "trainer_state.json"  # the Trainer's: written after the weights, optimizer and RNG states
# trainer_state.json held back while a background save writes the weights and optimizer (train/run/saving.py)
PENDING_STATE = TRAINER_STATE + ".pending"
# Inside final/:
CUT_SHORT = "cut_short.json"  # a stopped budgeted run's model (the stop, the steps after it): not a finished one


@dataclass(frozen=True)
class RunFiles:
    """The layout of one output_dir. Build it with ``RunFiles(config.training.output_dir)``."""

    root: Path

    def __init__(self, root: str | Path) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def final(self) -> Path:
        return self.root / "final"

    @property
    def final_staging(self) -> Path:
        """Where final/ is written before it is renamed into place (left over only by a crash)."""
        return self.root / ".final.tmp"

    def final_retired(self, pid: int) -> Path:
        """The old final/ for the moment between the two renames of a replacement."""
        return self.root / f".final.old-{pid}"

    @property
    def final_previous(self) -> Path:
        return self.root / "final.previous"

    @property
    def run_json(self) -> Path:
        return self.root / "run.json"

    @property
    def branch(self) -> Path:
        return self.root / "branch.json"

    @property
    def faults_fired(self) -> Path:
        """The fault drills that fired (train/run/drills.py): kept across rollbacks and restarts, so each fires once."""
        return self.root / "faults-fired.json"

    @property
    def all_results(self) -> Path:
        return self.root / "all_results.json"

    @property
    def finetune_results(self) -> Path:
        return self.root / FINETUNE_RESULTS

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def train_jsonl(self) -> Path:
        return self.logs / "train.jsonl"

    def crash_log(self, rank: int) -> Path:
        return self.logs / f"crash-rank-{rank}.txt"

    @property
    def report(self) -> Path:
        return self.root / "report.html"

    @property
    def loss_png(self) -> Path:
        return self.root / "loss.png"

    def record_files(self) -> list[Path]:
        """What a run writes beside its model and checkpoints when it ends: run.json, the results, logs/, the
        report."""
        return [self.run_json, self.all_results, self.logs, self.report, self.loss_png]

    @property
    def lease(self) -> Path:
        return self.root / ".lease"

    def checkpoint(self, step: int) -> Path:
        return self.root / f"{CHECKPOINT_PREFIX}{step}"

    def checkpoints(self) -> list[Path]:
        """Checkpoint directories, oldest first (whatever their state: train/outputs/checkpoints.py judges them)."""
        found = [p for p in self.root.glob(f"{CHECKPOINT_PREFIX}*") if p.is_dir() and is_checkpoint_name(p.name)]
        return sorted(found, key=step_of)

    def aside(self, checkpoint: Path, pid: int) -> Path:
        """Where an unusable checkpoint is moved (not deleted: the Trainer would write into it again)."""
        return self.root / f"{ASIDE_PREFIX}{checkpoint.name}-{pid}"

    def asides(self) -> list[Path]:
        """The checkpoints moved aside, newest first."""
        found = self.root.glob(f"{ASIDE_PREFIX}{CHECKPOINT_PREFIX}*")
        return sorted(found, key=lambda p: aside_step(p.name), reverse=True)


def aside_step(name: str) -> int:
    """The step of a checkpoint moved aside (``.invalid-checkpoint-15-<pid>``: 15), in a directory or a store."""
    return int(name.removeprefix(ASIDE_PREFIX).removeprefix(CHECKPOINT_PREFIX).split("-")[0])


def is_checkpoint_name(name: str) -> bool:
    return name.startswith(CHECKPOINT_PREFIX) and name[len(CHECKPOINT_PREFIX) :].isdigit()


def step_of(checkpoint: Path) -> int:
    """The step a checkpoint directory was saved at, from its name."""
    return int(checkpoint.name[len(CHECKPOINT_PREFIX) :])
