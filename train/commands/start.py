"""The one start of the sub-commands that read the options (evaluate, finetune, prepare): ``help`` answered, the
options loaded (defaults < YAML < env < CLI), the hub token moved into the environment the libraries read, the
console set up for the log format; then the command's body, given the Config. Their end, the ``__main__`` block
(run_main, the process group destroyed, exit_process), is train/common/distributed.py's ``run_and_exit``, low
enough for the training job (train/run/job.py) to end the same way.

The job does not start here: the launcher answers its ``help`` before torchrun starts a rank, its start-up clock
(train/run/startup.py) runs from before the options are read, its DDP timeout is applied before anything waits on
a collective, and its console is set up in ``run``, which the tests call without ``main``. ``average`` does not
either: it takes directories, not the options, and answers ``-h`` with its own usage line
(train/commands/average.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from train.common.usage import usage, wants_help
from train.config import Config, load_config, move_hub_token_to_env
from train.run.logs import configure_console


def start(
    command: str, body: Callable[[Config], int], argv: Sequence[str] | None = None, *, console: bool = True
) -> int:
    """``command``'s ``main``: its usage for ``-h``/``--help`` (exit 0), else ``body`` run on the options ``argv``
    (``sys.argv[1:]`` when None) give. ``console=False`` leaves the console as the libraries set it, progress
    bars in JSON too, as ``prepare`` has always had it."""
    args = list(sys.argv[1:] if argv is None else argv)
    if wants_help(args):
        print(usage(command))
        return 0
    config = load_config(args)
    move_hub_token_to_env(config, os.environ)
    if console:
        configure_console(config.launch.log_format)
    return body(config)
