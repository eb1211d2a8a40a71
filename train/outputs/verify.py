"""``python -m train.outputs.verify DIR_OR_URL`` (``./entrypoint.sh verify DIR_OR_URL``): is this final model or
checkpoint the one the run wrote? Every file is checked against the list its ``.complete`` marker holds (none
missing, none extra, each size and SHA-256 the same); a checkpoint is also checked as a resume checks it (whole,
and every state file passes the safe loader). A URL is downloaded into a temporary directory first.

Exit 0: intact (one line says how many files were checked); exit 2: a file is wrong (the line names it), or the
directory is no model or checkpoint, or holds no list to check against (written by an earlier version); exit 3:
the store cannot be read.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from train.common.console import say
from train.common.errors import ConfigError, exit_process, run_main
from train.common.urls import is_store_url
from train.outputs.checkpoints import problem
from train.outputs.marker import listed_files, manifest_problem
from train.outputs.runfiles import TRAINER_STATE
from train.outputs.store import Store

USAGE = "usage: entrypoint.sh verify DIR_OR_URL   (a final/ model or a checkpoint-N/, local or in a store)"
# The model card is written into final/ after its list (it names the weights' digest), by the push or MLflow.
ADDED_AFTER_THE_LIST = ("README.md",)


def verify(directory: Path, shown: str) -> str:
    """One line saying what was checked; ConfigError naming the wrong file."""
    if not directory.is_dir():
        raise ConfigError(f"{shown}: no such directory; {USAGE}")
    files = listed_files(directory)
    if files is None:
        raise ConfigError(
            f"{shown}: holds no list of its files (no .complete marker, or one from before markers "
            "listed files): nothing to verify against"
        )
    if (directory / TRAINER_STATE).is_file():
        wrong = problem(directory)
    else:
        wrong = manifest_problem(directory, ADDED_AFTER_THE_LIST)
    if wrong:
        raise ConfigError(f"{shown}: {wrong}")
    size = sum(entry.get("size", 0) for entry in files.values()) / 2**20
    return f"{shown}: intact: {len(files)} file(s), {size:,.1f} MiB, each size and SHA-256 as listed"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] in ("-h", "--help", "help"):
        print(USAGE, file=sys.stderr if len(args) != 1 else sys.stdout)
        return 0 if args and args[0] in ("-h", "--help", "help") else 2
    target = args[0]
    if not is_store_url(target):
        say(verify(Path(target).expanduser(), target))
        return 0
    with tempfile.TemporaryDirectory(prefix="mlm-verify-") as tmp:
        say(fetch(target, Path(tmp) / "copy", label="verify"))
    return 0


def fetch(url: str, local: Path, label: str) -> str:
    """A final model or checkpoint in a store, downloaded into ``local`` (a new directory) and verified there:
    the line :func:`verify` says; ConfigError naming a wrong file, EnvironmentProblem when the store fails."""
    store = Store(url, label=label)
    store.retrying(f"reading {store.url}", store.fs.get, store.root + "/", str(local) + "/", recursive=True)
    return verify(local, store.url)


if __name__ == "__main__":
    exit_process(run_main(main))
