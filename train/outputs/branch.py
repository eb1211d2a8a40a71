"""A branch: a new run that starts from a checkpoint of its own run or another's (its weights, optimizer and
scheduler state, step and data position), with options changed: another decay, mixture or length. mmBERT's three
decay variants from one stable checkpoint are three branches.

The launcher seeds the branch's output_dir once (:func:`seed`): the parent checkpoint, verified as a resume
verifies one (whole, every file as its list says, every state file through the safe loader), copied in as it was,
and ``branch.json`` naming where it came from. The run then resumes from that copy as from any checkpoint, except
that the branch point is allowed to differ from the options and data it was saved with (that is what a branch
is), and a changed learning rate scales the restored schedule (train/run/callbacks.py ``BranchLearningRate``).
Run the same command again after a stop and it resumes the branch's own newest checkpoint; ``branch.json`` stays.

``branch.json`` is read back as data (:meth:`BranchPoint.read`): a field of the wrong type is refused, naming it,
and it never leads a read outside the output_dir (the checkpoint it names is a checkpoint name, nothing else).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from train.common.console import now
from train.common.errors import ConfigError
from train.common.urls import is_store_url, without_credentials
from train.outputs.checkpoints import problem, saved_options
from train.outputs.marker import listed_files
from train.outputs.record import write_json_atomic
from train.outputs.runfiles import TRAINER_STATE, RunFiles, is_checkpoint_name, step_of
from train.outputs.verify import fetch

USAGE = "usage: ./entrypoint.sh branch CHECKPOINT_OR_URL --output_dir DIR [--option value ...]"


@dataclass(frozen=True)
class BranchPoint:
    """``branch.json``: where a branch started."""

    parent: str  # the checkpoint as the user named it (a URL without its credentials)
    checkpoint: str  # its name in this output_dir: checkpoint-N
    step: int  # N: the parent's step the branch continues from
    parent_options: dict[str, Any]  # the options the parent saved the checkpoint with (redacted, as it wrote them)
    seeded: str  # when the launcher copied it in

    @property
    def learning_rate(self) -> float | None:
        """The parent's peak learning rate, which its saved scheduler state holds."""
        value = self.parent_options.get("learning_rate")
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    def line(self) -> str:
        return f"a branch of {self.parent} at step {self.step}"

    def as_record(self) -> dict[str, Any]:
        """run.json's ``branch``: the parent, its step, and the options the branch changed are in ``config``."""
        return {"parent": self.parent, "checkpoint": self.checkpoint, "step": self.step, "seeded": self.seeded}

    @classmethod
    def read(cls, files: RunFiles) -> BranchPoint | None:
        """The branch point of the run in ``files``, or None when it is no branch; ConfigError naming a field that
        is not what the launcher writes."""
        path = files.branch
        if not path.exists() and not path.is_symlink():
            return None
        shown = str(path)
        if path.is_symlink() or not path.is_file():
            raise ConfigError(f"{shown}: not a regular file; a branch's record is one the launcher wrote")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(f"{shown}: does not parse as JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{shown}: expected a JSON object")
        expected = {"parent": str, "checkpoint": str, "step": int, "parent_options": dict, "seeded": str}
        for name, kind in expected.items():
            value = data.get(name)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ConfigError(f"{shown}: field {name!r} is missing or not a {kind.__name__}")
        if not is_checkpoint_name(data["checkpoint"]) or step_of(Path(data["checkpoint"])) != data["step"]:
            raise ConfigError(f"{shown}: field 'checkpoint' must be checkpoint-<step> for its 'step'")
        return cls(**{name: data[name] for name in expected})


def is_branch_point(branch: BranchPoint | None, checkpoint: str | Path | None) -> BranchPoint | None:
    """``branch`` (the output_dir's, ``BranchPoint.read``) when ``checkpoint``, the one this run resumes from, is
    its branch point; else None (a later resume of the branch, or no branch)."""
    if not checkpoint or branch is None:
        return None
    return branch if Path(checkpoint).name == branch.checkpoint else None


def seed(files: RunFiles, source: str) -> tuple[BranchPoint, bool]:
    """The branch point of the output_dir in ``files``: made from ``source`` (a checkpoint directory or a URL of
    one) when the directory holds no run yet, else the one it holds (True: already seeded, the branch resumes).
    ConfigError when ``source`` is no intact checkpoint, or the directory holds another run or another branch."""
    shown = without_credentials(source) if is_store_url(source) else source
    existing = BranchPoint.read(files)
    if existing is not None:
        if existing.parent != shown:
            raise ConfigError(
                f"{files.root}: is a branch of {existing.parent}, not of {shown}; give each branch its own output_dir"
            )
        return existing, True
    if files.checkpoints() or files.final.exists() or files.run_json.exists():
        raise ConfigError(f"{files.root}: holds a run already; a branch starts in an empty (or new) output_dir")
    with tempfile.TemporaryDirectory(prefix=".branch-", dir=files.root) as tmp:
        checkpoint = fetched(source, shown, Path(tmp))
        copy = Path(tmp) / "copy"
        if checkpoint.parent == Path(tmp):
            checkpoint.rename(copy)
        else:
            shutil.copytree(checkpoint, copy)  # links were refused: the copy is the files themselves
        branch = BranchPoint(shown, checkpoint.name, step_of(checkpoint), saved_options(copy), now())
        copy.rename(files.root / checkpoint.name)
    write_json_atomic(files.branch, asdict(branch))
    return branch, False


def unseed(files: RunFiles, point: BranchPoint) -> None:
    """Undo a fresh :func:`seed` (the branch was refused before it started): its copy of the checkpoint and
    ``branch.json`` removed, the output_dir as it was."""
    shutil.rmtree(files.root / point.checkpoint, ignore_errors=True)
    files.branch.unlink(missing_ok=True)


def fetched(source: str, shown: str, scratch: Path) -> Path:
    """The checkpoint ``source`` names, verified as a resume verifies one (train/outputs/checkpoints.py): a local
    directory as it is, a URL downloaded into ``scratch`` under its own name. ConfigError naming what is wrong."""
    if is_store_url(source):
        download = scratch / "download"
        fetch(source, download, label="branch")
        checkpoint = scratch / source.rstrip("/").rsplit("/", 1)[-1]
        download.rename(checkpoint)
    else:
        checkpoint = Path(source).expanduser()
        if not checkpoint.is_dir():
            raise ConfigError(f"{shown}: no such directory; {USAGE}")
    if not is_checkpoint_name(checkpoint.name) or not (checkpoint / TRAINER_STATE).is_file():
        raise ConfigError(f"{shown}: not a checkpoint (a checkpoint-N/ directory of a run); {USAGE}")
    wrong = problem(checkpoint)  # links, state files through the safe loader, every file as its list says
    if wrong is None and listed_files(checkpoint) is None:
        wrong = "holds no list of its files (no .complete marker): nothing to verify it against"
    if wrong:
        raise ConfigError(f"{shown}: cannot be branched from: {wrong}")
    return checkpoint
