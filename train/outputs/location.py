"""Where a run's outputs live, decided once: output_dir a directory, or a store's URL trained into a local
staging directory and mirrored there (train/config/implied.py's ``stage_outputs`` resolved the URL into
``Config.output_store`` and the staging directory). Every caller - the launcher, ``plan``, ``doctor``, the job -
holds what :func:`output_location` returns and calls its methods (train/outputs/base.py); none asks which kind
it has."""

from __future__ import annotations

from train.config import Config
from train.outputs.base import OutputLocation, OutputOptions
from train.outputs.checkpoints import resumed_options
from train.outputs.local import Directory
from train.outputs.mirror import Mirror


def output_location(config: Config) -> OutputLocation:
    """The run's outputs: a :class:`Mirror` of a store when output_dir names one, else a :class:`Directory`. It
    takes the whole Config because it assembles the location's options from it: the output directory, the
    outputs and checkpoint sections, the store, and the resolved options a resume compares."""
    options = OutputOptions(
        training=config.training,
        outputs=config.outputs,
        checkpoint=config.checkpoint,
        resumed=lambda: resumed_options(config.as_dict(redact=True), config.training.world_size),
        store=config.output_store,
        store_source=config.output_store_source,
    )
    return Directory(options) if options.store is None else Mirror(options)
