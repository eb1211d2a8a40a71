"""Outputs in a directory (a mounted volume): the atomic ``final/``, the directory's checks, starting over and
the resume choice through train/outputs/checkpoints.py. A bucket's staging directory is written with the same
:func:`publish_final` (train/outputs/mirror.py)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from train.outputs.base import OutputLocation, Warn
from train.outputs.branch import BranchPoint, is_branch_point
from train.outputs.checkpoints import decide_resume, resume_choice
from train.outputs.lease import OutputLease
from train.outputs.marker import write_marker
from train.outputs.runfiles import CUT_SHORT, RunFiles, step_of


def publish_final(files: RunFiles, write: Callable[[Path], None]) -> Path:
    """Write the final model into a temporary directory, then rename it into place.

    A crash at any point leaves either no ``final/`` or the previous one whole, never a partial one.
    """
    final, staging = files.final, files.final_staging
    shutil.rmtree(staging, ignore_errors=True)  # left over by a crashed run
    staging.mkdir(parents=True)
    write(staging)
    write_marker(staging)  # its files with their digests: ./entrypoint.sh verify checks a downloaded copy
    if final.exists():
        retired = files.final_retired(os.getpid())
        os.replace(final, retired)
        os.replace(staging, final)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(staging, final)
    shutil.rmtree(files.final_previous, ignore_errors=True)  # a replaced run's model, kept until now
    return final


class Directory(OutputLocation):
    """output_dir is a directory: the run writes it directly."""

    @property
    def shown(self) -> str:
        return str(self.files.root)

    @property
    def where(self) -> str:
        return f"{self.root_label}={str(self.files.root)!r}"

    @property
    def final_shown(self) -> str:
        return str(self.files.final)

    def summary(self) -> str:
        files = self.files
        return f"{files.root} (logs in {files.logs}, report {files.report})"

    def preflight(self) -> None:
        """Nothing beyond the directory itself (:meth:`check` creates it and writes a probe there)."""

    def has_final(self) -> bool:
        final = self.files.final
        return final.exists() and not (final / CUT_SHORT).exists()

    def retire_final(self) -> None:
        files = self.files
        shutil.rmtree(files.final_previous, ignore_errors=True)
        os.replace(files.final, files.final_previous)

    def remove_checkpoints(self) -> int:
        old = self.files.checkpoints()
        for checkpoint in old:
            shutil.rmtree(checkpoint)
        return len(old)

    def survey(self) -> tuple[str, dict[str, Any]]:
        chosen, skipped = resume_choice(self.options.checkpoint, self.files)  # reads (and digests) the checkpoints once
        resume = f"resume from {chosen.name}" if chosen else "start from step 0"
        return resume, {"dir": str(self.files.root), "skipped_checkpoints": {path.name: why for path, why in skipped}}

    def newest_step(self) -> int:
        return max((step_of(path) for path in self.files.checkpoints()), default=0)

    def lease(self) -> OutputLease:
        return OutputLease(self.files, self.root_label)

    def choose_resume(self, warn: Warn) -> str | None:
        self.start_over(warn)
        return decide_resume(self.options.checkpoint, self.files, self.options.resumed(), warn, self._honoured)

    def _honoured(self, chosen: Path) -> tuple[str, ...]:
        """A branch's first start, from its branch point, applies a new learning rate (train/run/branching.py)."""
        return ("learning_rate",) if is_branch_point(BranchPoint.read(self.files), chosen) else ()

    def publish(self, write: Callable[[Path], None]) -> None:
        publish_final(self.files, write)
