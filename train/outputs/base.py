"""What every output location does, and the rules that are the same wherever the outputs live.

A run's outputs live in a directory (train/outputs/local.py) or in a bucket through a local staging directory
(train/outputs/mirror.py); train/outputs/location.py decides which, once. The job, the launcher, ``plan`` and
``doctor`` hold an :class:`OutputLocation` and call its methods: none of them asks which kind it has. The rules
written here once for both kinds: a finished ``final/`` is refused unless MLM_OVERWRITE_OUTPUT_DIR=true, and
then the run starts over (:meth:`OutputLocation.start_over`); what a run would do there (:meth:`facts`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainingArguments

from train.common.errors import ConfigError, EnvironmentProblem
from train.common.paths import first_link_under
from train.common.writable import probe_write, write_failure
from train.config import CheckpointArguments, OutputArguments
from train.outputs.lease import OutputLease
from train.outputs.retention import Retention
from train.outputs.runfiles import RunFiles

Warn = Callable[[str], None]
REFUSE = "refuse: it holds a finished model (MLM_OVERWRITE_OUTPUT_DIR=true replaces it)"
START_OVER = "start over from step 0, replacing the finished model at its end"


@dataclass(frozen=True)
class OutputOptions:
    """What an output location reads of the run's options (train/outputs/location.py gathers them)."""

    training: TrainingArguments  # output_dir: the local tree; this node's local rank (a bucket's download)
    outputs: OutputArguments  # starting over on a finished model, a store's retries
    checkpoint: CheckpointArguments  # the checkpoint a run resumes from
    # The run's options as a checkpoint records them (train/outputs/checkpoints.py resumed_options), asked when a
    # resume is chosen: a resume on other options than the checkpoint's says what changes.
    resumed: Callable[[], dict[str, Any]]
    store: str | None = None  # output_dir as set when it is a store's URL (the Config's output_store)
    store_source: str = "output_dir"  # where that URL was set


class OutputLocation(ABC):
    """One run's outputs. ``files`` is the local tree every rank writes (output_dir itself, or the staging
    directory of a bucket): the Trainer and the job write directories only."""

    def __init__(self, options: OutputOptions) -> None:
        self.options = options
        self.files = RunFiles(options.training.output_dir)

    @property
    def root_label(self) -> str:
        """The option that set the local directory, as errors name it (MLM_STAGING_DIR for a bucket's staging
        directory)."""
        return self.options.outputs.source_of("output_dir")

    # -- how it is named --
    @property
    @abstractmethod
    def shown(self) -> str:
        """The location as a person names it: the directory's path or the bucket's URL."""

    @property
    @abstractmethod
    def where(self) -> str:
        """The option and its value, as an error message starts: ``MLM_OUTPUT_DIR='/output'``."""

    @property
    @abstractmethod
    def final_shown(self) -> str:
        """Where the finished model is: a path or a URL."""

    @abstractmethod
    def summary(self) -> str:
        """The banner's outputs line: where the outputs go, and where to look."""

    # -- what each kind does in its own way --
    @abstractmethod
    def preflight(self) -> None:
        """Beyond the local directory: can the run write where the outputs live? EnvironmentProblem (exit 3) or
        ConfigError (exit 2) when it cannot. Looks only (doctor calls it)."""

    @abstractmethod
    def has_final(self) -> bool:
        """A finished model is there."""

    @abstractmethod
    def retire_final(self) -> None:
        """final/ becomes final.previous/ (replacing an older one), kept until this run publishes its own."""

    @abstractmethod
    def remove_checkpoints(self) -> int:
        """Remove a finished run's checkpoints (resuming from them would train 0 steps); returns how many."""

    @abstractmethod
    def survey(self) -> tuple[str, dict[str, Any]]:
        """One look at the checkpoints: what a run would resume from, in words (``resume from checkpoint-8``,
        ``start from step 0``), and the kind's own facts for ``plan``: the directory, or the store and its
        staging directory."""

    @abstractmethod
    def newest_step(self) -> int:
        """The step of the newest checkpoint there (0 for none), without judging it: where a phased run stands."""

    @abstractmethod
    def lease(self) -> OutputLease:
        """One job at a time in this location."""

    @abstractmethod
    def choose_resume(self, warn: Warn) -> str | None:
        """World rank 0, holding the lease, before training: start over if asked, set damaged checkpoints aside,
        and return the local checkpoint to resume from (None: from step 0)."""

    @abstractmethod
    def publish(self, write: Callable[[Path], None]) -> None:
        """World rank 0: the finished model written by ``write`` into final/, whole or not at all."""

    def localize(self, resume: str | None) -> str | None:
        """Every rank, once world rank 0 chose ``resume``: this node's path of it."""
        return resume

    def checkpoint_saved(self, step: int, retention: Retention, protect: list[int]) -> None:  # noqa: B027 - a directory does nothing
        """Every rank, after each checkpoint is whole in ``files`` (``retention``: which ones are kept; ``protect``:
        the steps rotation must keep)."""

    def sync(self, *paths: Path) -> None:  # noqa: B027 - a directory does nothing
        """Make these files of ``files`` durable where the outputs live (nothing to do in a directory)."""

    def keep_crash_log(self, log: Path) -> None:  # noqa: B027 - a directory does nothing
        """A crashed rank's traceback kept where the outputs live, quickly, never raising."""

    # -- the rules, once for both kinds --
    def check(self, dry_run: bool = False) -> None:
        """Before any work: writable, and no finished model to overwrite unless asked (a dry run, ``plan``,
        reports a finished model as a fact instead: :meth:`facts`)."""
        try:
            self.files.root.mkdir(parents=True, exist_ok=True)
            probe_write(self.files.root)
        except OSError as exc:
            message = f"{self.root_label}={str(self.files.root)!r}: not writable ({write_failure(exc)}); "
            raise EnvironmentProblem(message + "expected a writable directory") from None
        self.refuse_links()
        self.preflight()
        if not dry_run:
            self.refuse_finished()

    def refuse_links(self) -> None:
        """No symbolic link inside the local directory (ConfigError naming the first): a run writing, or starting
        over and moving, through one could write outside it (train/common/paths.py's rule)."""
        link = first_link_under(self.files.root)
        if link is not None:
            raise ConfigError(
                f"{self.root_label}={str(self.files.root)!r}: {link} is a symbolic link inside "
                "it; the job never writes through one: remove it, or choose another output_dir"
            )

    def refuse_finished(self) -> None:
        """A finished ``final/`` is replaced only when asked (ConfigError otherwise)."""
        if self.has_final() and not self.options.outputs.overwrite_output_dir:
            raise ConfigError(
                f"{self.where}: holds a finished model in {self.files.final.name}/; set "
                "MLM_OVERWRITE_OUTPUT_DIR=true to replace it, or choose another output_dir"
            )

    def start_over(self, warn: Warn) -> bool:
        """MLM_OVERWRITE_OUTPUT_DIR=true on a finished run: this run starts from step 0.

        The finished model is kept, renamed ``final.previous/``, until this run publishes its own, and the
        finished run's checkpoints are removed. Once started over there is no ``final/``: a preempted restart
        with the same options resumes its own checkpoints instead of starting again. World rank 0 only, before
        the resume decision."""
        outputs = self.options.outputs
        if not (outputs.overwrite_output_dir and self.has_final()):
            return False
        self.retire_final()
        resume = self.options.checkpoint.resume
        removed = self.remove_checkpoints() if resume in ("auto", "never") else 0  # a named one stays
        previous = self.files.final_previous.name
        warn(
            f"{outputs.source_of('overwrite_output_dir')}=true: starting over; the finished model is kept in "
            f"{previous}/ of {self.shown} until this run's final/ replaces it, and its {removed} checkpoint(s) "
            "were removed"
        )
        return True

    def facts(self) -> dict[str, Any]:
        """What a run would find there and do (``plan``, ``doctor``): looks only."""
        resume, details = self.survey()
        finished = self.has_final()
        if finished and not self.options.outputs.overwrite_output_dir:
            would = REFUSE
        else:
            would = START_OVER if finished else resume
        return {**details, "finished_model": finished, "a run would": would}
