"""``python -m train.launch {train|plan|help} [option flags]``: resolve the options, detect the GPUs, plan, then
print the plan (``plan``, exit 0) or run torchrun and exit with the documented code (``train``); ``help`` (and
``-h``/``--help`` after either) prints the usage (train/common/usage.py) or the options, exit 0."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence

from train.common.console import Console, resolve_format
from train.common.errors import ConfigError, exit_process, run_main
from train.common.usage import COMMANDS, usage, wants_help
from train.common.writable import check_cache_dir
from train.config import options_text
from train.launch.plan import (
    EVALUATE_MODULE,
    JOB_MODULE,
    launcher_config,
    make_plan,
    plan_document,
    summary,
    torchrun_path,
)
from train.launch.torchrun import launch
from train.machine.gpus import detect, torch_cuda_version
from train.machine.resources import shm_size, usable_cpus
from train.outputs.location import output_location

USAGE = "usage: ./entrypoint.sh [train|plan|evaluate|help] [--option value ...]"


def help_text(topic: Sequence[str]) -> str:
    """``help``: the front door's usage; ``help COMMAND``: one command's; ``help options [--all]``: the options."""
    if topic[:1] == ["options"]:
        return options_text(every="--all" in topic[1:])
    if topic and topic[0] not in COMMANDS:
        raise ConfigError(f"help {topic[0]}: no such command or topic; expected one of {', '.join(COMMANDS)}, options")
    return usage(topic[0] if topic else None)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """``train``: launch and exit with the documented code; ``plan``: print the decisions as JSON."""
    args = list(sys.argv[1:] if argv is None else argv)
    environ = os.environ if environ is None else environ
    named = bool(args) and not args[0].startswith("-")
    command = args.pop(0) if named else "train"
    if command == "help":
        print(help_text(args))
        return 0
    if command not in ("train", "plan", "evaluate"):
        raise ConfigError(f"unknown command {command!r}; {USAGE}")
    if wants_help(args):  # with no command named, the front door's usage
        print(usage(command if named else None))
        return 0

    config = launcher_config(args, environ)
    # auto is judged once, on the launcher's stdout: the ranks' stdout is a pipe under torchrun.
    log_format = resolve_format(config.job.log_format)
    torch_cuda = torch_cuda_version()
    module = EVALUATE_MODULE if command == "evaluate" else JOB_MODULE
    plan = make_plan(
        config,
        detect(environ),
        environ,
        args,
        torch_cuda,
        usable_cpus(),
        torchrun_path(),
        log_format,
        shm_size(),
        module,
    )
    # The job's own checks, before torchrun: an unwritable output_dir (3) or a finished final/ there (2, but
    # a dry run only reports it; an evaluation writes its results beside a finished model).
    location = output_location(config)
    location.check(dry_run=command != "train")
    if command == "plan":
        document = plan_document(plan, config, torch_cuda)
        document["output_dir"] = location.facts()
        print(json.dumps(document, indent=2, default=str))
        return 0
    check_cache_dir(environ)  # a run writes tokenized data there (3 when it cannot)
    log = Console(log_format)
    for warning in plan.warnings:
        log.warning(warning)
    log(summary(plan))
    log(plan.batch.banner)
    return launch(plan, environ, log, config.job.rdzv_timeout)


if __name__ == "__main__":
    exit_process(run_main(main))
