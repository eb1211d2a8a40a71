"""``python -m train.launch {train|plan|help} [option flags]``: resolve the options, detect the GPUs, plan, then
print the plan (``plan``, exit 0) or run torchrun and exit with the documented code (``train``); ``help`` (and
``-h``/``--help`` after either) prints the usage (train/common/usage.py) or the options, exit 0."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from train.common.console import Console, resolve_format
from train.common.errors import ConfigError, exit_process, run_main
from train.common.usage import command_help, usage, wants_help
from train.common.writable import check_cache_dir
from train.config import Config, config_file, options_text, phases_in
from train.launch.branch_options import inherited, parent_recipe
from train.launch.deadline import deadline_line
from train.launch.hub import reach_the_hub
from train.launch.inputs import EVALUATE_MODULE, FINETUNE_MODULE, JOB_MODULE, Host, Launch
from train.launch.phases import (
    PlannedPhase,
    phases_document,
    plan_phases,
    refuse_run_length,
    run_phases,
    with_phase,
)
from train.launch.plan import (
    Plan,
    launcher_config,
    make_plan,
    plan_document,
    summary,
    torchrun_path,
)
from train.launch.replay import (
    ANYWAY,
    compare_final,
    differences,
    overridden,
    read_run,
    replay_argv,
    split_args,
    withheld,
)
from train.launch.torchrun import launch
from train.launch.watchdog import HangBound
from train.machine.gpus import detect, torch_cuda_version
from train.machine.resources import shm_size, usable_cpus
from train.outputs.base import OutputLocation
from train.outputs.branch import USAGE as BRANCH_USAGE
from train.outputs.branch import BranchPoint, seed, unseed
from train.outputs.location import output_location

USAGE = "usage: ./entrypoint.sh [train|plan|evaluate|finetune|replay|branch|help] [--option value ...]"
# The commands that launch ranks other than the training job: the same plan, another program.
SCORING_MODULES = {"evaluate": EVALUATE_MODULE, "finetune": FINETUNE_MODULE}


def help_text(topic: Sequence[str]) -> str:
    """``help``: the front door's usage; ``help COMMAND``: one command's; ``help options [--all]``: the options."""
    if topic[:1] == ["options"]:
        return options_text(every="--all" in topic[1:])
    return command_help(topic)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """``train``: launch and exit with the documented code; ``plan``: print the decisions as JSON; ``evaluate``,
    ``finetune``: launch a scoring program instead; ``replay``: a run's recipe again (train/launch/replay.py)."""
    args = list(sys.argv[1:] if argv is None else argv)
    environ = os.environ if environ is None else environ
    named = bool(args) and not args[0].startswith("-")
    command = args.pop(0) if named else "train"
    if command == "help":
        print(help_text(args))
        return 0
    if command not in ("train", "plan", "replay", "branch", *SCORING_MODULES):
        raise ConfigError(f"unknown command {command!r}; {USAGE}")
    if wants_help(args):  # with no command named, the front door's usage
        print(usage(command if named else None))
        return 0
    if command == "replay":
        return replay(args, environ)
    if command == "branch":
        return branch(args, environ)

    config = launcher_config(args, environ)
    # auto is judged once, on the launcher's stdout: the ranks' stdout is a pipe under torchrun.
    log_format = resolve_format(config.launch.log_format)
    path = config_file(args, environ)
    specs = phases_in(path) if command in ("train", "plan") else []
    if specs:
        refuse_run_length(config.sources, path or "")
        phases = plan_phases(specs, args, environ, planner(environ, log_format))
        return phased(command, phases, output_location(config), environ, log_format)
    plan = planner(environ, log_format, SCORING_MODULES.get(command, JOB_MODULE))(config, args)
    # The job's own checks, before torchrun: an unwritable output_dir (3) or a finished final/ there (2, but
    # a dry run only reports it; a score is written beside a finished model).
    location = output_location(config)
    location.check(dry_run=command != "train")
    if command == "plan":
        document = plan_document(plan, config, torch_cuda_version())
        document["output_dir"] = location.facts()
        print(json.dumps(document, indent=2, default=str))
        return 0
    return start(config, plan, environ, Console(log_format))


def planner(
    environ: Mapping[str, str], log_format: str, module: str = JOB_MODULE
) -> Callable[[Config, Sequence[str]], Plan]:
    """Every launch decision for a config and its flags (train/launch/plan.py make_plan), on this machine as it is
    found at each call: the ranks run ``module``, their logs in ``log_format``."""
    launch = Launch(torchrun_path(), log_format, module)
    return lambda config, args: make_plan(config, this_host(environ), environ, args, launch)


def this_host(environ: Mapping[str, str]) -> Host:
    """This node as the launcher finds it now: its GPUs, torch's CUDA, the CPUs it may use, /dev/shm."""
    return Host(detect(environ), torch_cuda_version(), usable_cpus(), shm_size())


def start(config: Config, plan: Plan, environ: Mapping[str, str], log: Console) -> int:
    """torchrun with the plan, once the cache is writable and the hub answered for what the run reads from it
    (train/launch/hub.py); the documented exit code. It takes the whole Config because it hands each part its
    section: the hub its model and data, torchrun the launch's timeout."""
    check_cache_dir(environ)  # a run writes tokenized data there (3 when it cannot)
    environ, said = reach_the_hub(config.model, config.data, environ)
    for line in said:
        log.warning(line)
    for warning in plan.warnings:
        log.warning(warning)
    log(summary(plan))
    log(plan.batch.banner)
    if plan.deadline:
        log(deadline_line(plan.deadline))
    hang = HangBound(
        config.resilience.hang_timeout,
        config.training.ddp_timeout,
        Path(config.training.output_dir) / "logs",
        config.source_of("hang_timeout"),
    )
    return launch(plan, environ, log, config.launch.rdzv_timeout, hang)


def replay(args: Sequence[str], environ: Mapping[str, str]) -> int:
    """A finished run's recipe again, refused where something would make it differ (unless --anyway), and its
    final/ compared with the recorded one at the end."""
    # The data's fingerprint needs the datasets library: imported for a replay only (every other command's
    # start-up stays without it). The ranks load the data again: the refusal must come before any process starts,
    # and their load reads the cache this one wrote (a stream's load reads no data at all).
    from train.data import load_raw
    from train.data.identity import changes

    location, overrides, anyway = split_args(args)
    run = read_run(location)
    argv = replay_argv(run, location, overrides)
    config = launcher_config(argv, environ)
    log_format = resolve_format(config.launch.log_format)
    log = Console(log_format)
    not_taken = withheld(run, config.model, config.sources, location)
    if not_taken:
        log.warning(
            f"replay {location}: not taken from the record (they reach the network; name them to use them): "
            + ", ".join(not_taken)
        )
    plan = planner(environ, log_format)(config, argv)
    world = plan.nproc_per_node * plan.topology.max_nodes
    raw = load_raw(config.data, config.training)
    found = differences(run, config, overrides, world, raw.fingerprint, changes(run.data_identity, raw.identity)[0])
    for line in found:
        log(f"replay {location}: {line}", "warning" if anyway else "error")
    if found and not anyway:
        raise ConfigError(f"replay {location}: refused, {len(found)} difference(s) above; {ANYWAY} runs it regardless")
    changed = overridden(config.sources, overrides)
    if changed:
        log.warning(f"no longer a replay of {location}: {', '.join(changed)} named on the command line")
    location_of_outputs = output_location(config)
    location_of_outputs.check()
    code = start(config, plan, environ, log)
    if code == 0:
        log(f"replay of {location}: " + compare_final(run, location, location_of_outputs.files.final))
    return code


def phased(
    command: str,
    phases: Sequence[PlannedPhase],
    location: OutputLocation,
    environ: Mapping[str, str],
    log_format: str,
) -> int:
    """A run in phases (train/launch/phases.py), each planned (``phases``), in one output ``location``: ``plan``
    shows every phase's place and options beside the first phase's plan; ``train`` runs the phases not yet trained,
    one torchrun each."""
    location.check(dry_run=command != "train")
    if command == "plan":
        document = plan_document(phases[0].plan, phases[0].config, torch_cuda_version())
        document["output_dir"] = location.facts()
        document["phases"] = phases_document(phases)
        print(json.dumps(document, indent=2, default=str))
        return 0
    log = Console(log_format)

    def launch_phase(phase: PlannedPhase) -> int:
        started = time.time() if phase.facts.index > 0 else None
        plan = with_phase(planner(environ, log_format)(phase.config, phase.argv), phase.facts, started)
        return start(phase.config, plan, environ, log)

    return run_phases(phases, location.newest_step(), log, launch_phase)


def branch(args: Sequence[str], environ: Mapping[str, str]) -> int:
    """A run from another run's checkpoint with options changed (train/outputs/branch.py): its output_dir seeded
    with the checkpoint, verified, then trained as a resume of it with its parent's options but those the branch sets
    (train/launch/branch_options.py); run again, it resumes the branch. A branch refused before it starts leaves
    nothing in its output_dir."""
    source, rest = branch_source(args)
    given = launcher_config(rest, environ)
    path = config_file(rest, environ)
    if phases_in(path):
        raise ConfigError(f"{path}: phases: a branch trains one set of options; give it a preset without phases")
    log_format = resolve_format(given.launch.log_format)
    log = Console(log_format)
    location = output_location(given)
    if given.output_store:
        raise ConfigError(
            f"{given.output_store_source}={given.output_store}: a branch is written to a directory (a mounted "
            "volume), not a bucket; the checkpoint it starts from may be in one"
        )
    location.check()
    point, seeded = seed(location.files, source)
    try:
        flags, taken = inherited(parent_recipe(point), given.sources, given.as_dict().keys())
        argv = [*flags, *rest]
        config = launcher_config(argv, environ)
        plan = planner(environ, log_format)(config, argv)
        refuse_no_steps(config.training.max_steps, config.source_of("max_steps"), point)
    except ConfigError:
        if not seeded:
            unseed(location.files, point)
        raise
    log(f"{'resuming ' if seeded else ''}{point.line()} into {location.shown}")
    if taken:
        log(f"the parent's options where the branch sets none: {', '.join(taken)}")
    return start(config, plan, environ, log)


def branch_source(args: Sequence[str]) -> tuple[str, list[str]]:
    """``branch``'s checkpoint (its first argument) and the option flags after it."""
    if not args or args[0].startswith("-"):
        raise ConfigError(f"branch: name the checkpoint to branch from; {BRANCH_USAGE}")
    return args[0], list(args[1:])


def refuse_no_steps(steps: int, label: str, point: BranchPoint) -> None:
    """A branch whose max_steps (``steps``, set by ``label``) the parent's step already reached would train
    nothing: refused, naming both."""
    if 0 < steps <= point.step:
        raise ConfigError(
            f"{label}={steps}: the branch starts at step {point.step} of its parent "
            f"({point.parent}); set a max_steps above it (the steps are counted from the parent's start)"
        )


if __name__ == "__main__":
    exit_process(run_main(main))
