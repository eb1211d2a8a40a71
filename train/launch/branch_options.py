"""A branch's options: its parent's, changed only where the branch's own command line, environment or YAML sets one.

Each checkpoint records the options its run set (``recipe`` in ``mlm_options.json``: run.json's ``options``, a
preset's included; train/outputs/record.py recipe). A branch of it starts from them, so that a run trained with a
preset or a long list of options branches with only what changes (``branch CHECKPOINT --output_dir DIR
--learning_rate X``): without them it would train the defaults' model on the defaults' data from the parent's
weights. The ranks get the same flags as the launcher, before the branch's own, which win.

What the record may not decide for the person typing ``branch`` is replay's rule (train/launch/replay.py
``NOT_FROM_THE_RECORD``): a model's own code, what reaches the network, where anything is written. The record is read
from the branch's verified copy of the checkpoint (train/outputs/branch.py seed), as data: a name this version does
not know is left out, and every value goes through the options' own parsing and bounds as a flag would.

What no library offers: the Trainer resumes a checkpoint's state, never the options that made it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from train.launch.replay import NOT_FROM_THE_RECORD, flag_values
from train.outputs.branch import BranchPoint
from train.outputs.checkpoints import RECIPE


def parent_recipe(point: BranchPoint) -> dict[str, Any]:
    """The options the parent run set, as its checkpoint recorded them; empty for a checkpoint written before they
    were recorded (or whose record is not a mapping)."""
    recorded = point.parent_options.get(RECIPE)
    return {str(name): value for name, value in recorded.items()} if isinstance(recorded, dict) else {}


def inherited(
    recorded: Mapping[str, Any], set_here: Collection[str], known: Collection[str]
) -> tuple[list[str], list[str]]:
    """The parent's options (``recorded``) as flags, less those set for the branch (``set_here``: its sources), those
    a record may not decide, and names this version does not know (``known``); and their names, for the log."""
    names = [n for n in sorted(recorded) if n in known and n not in set_here and n not in NOT_FROM_THE_RECORD]
    return [flag for name in names for flag in flag_values(name, recorded[name])], names
