"""A phased run (train/config/phases.py), launched: each phase is one torchrun of the job with the phase's options
on top of the run's and ``max_steps`` at the phase's end, resuming from the previous phase's last checkpoint (its
weights, optimizer, schedule and RNG state), in one output_dir. The ranks learn the phase from the hand-off
(``Handoff.phase``): the schedule is the whole plan's, a phase that is not the last ends with a checkpoint and no
final/, and the checkpoint a phase starts from may hold other data and batch options than the phase's (its
predecessor's).

Why one torchrun per phase rather than one for the whole plan: a phase change rebuilds what the Trainer holds for
its whole life (the data and its loader, the collator, the batch), and the resume path is the one that is already
proven to continue bit-identically; a phase start is that resume. A stopped run, run again, starts at the phase of
its newest checkpoint and resumes inside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from train.common.errors import ConfigError
from train.common.handoff import HANDOFF_ENV, Handoff
from train.common.phase import PhaseFacts
from train.config import Config, PhaseSpec, phase_flags
from train.config.recipes import is_recipe_source
from train.launch.plan import Plan, launcher_config

# Options the phases decide for the whole run: set with phases, they would be overruled, so they are refused.
RUN_LENGTH = ("max_steps", "num_train_epochs", "time_budget")


@dataclass(frozen=True)
class PlannedPhase:
    facts: PhaseFacts
    options: dict  # what the phase changes, as the YAML gives it
    argv: list[str]  # the run's flags, then the phase's, then its max_steps
    config: Config
    plan: Plan


def refuse_run_length(sources: Mapping[str, str], path: str) -> None:
    """A phased run's length is its phases': max_steps, epochs or a time budget set beside them (in ``sources``,
    where each set option came from) is refused."""
    for name in RUN_LENGTH:
        if name in sources and not is_recipe_source(sources[name]):  # overruled quietly
            raise ConfigError(
                f"{sources[name]}: a run in phases ({path}: phases) takes its length from them; remove "
                f"{name}, or give the phases' lengths (steps or tokens) instead"
            )


def plan_phases(
    specs: Sequence[PhaseSpec],
    argv: Sequence[str],
    environ: Mapping[str, str],
    planner: Callable[[Config, Sequence[str]], Plan],
) -> list[PlannedPhase]:
    """Every phase's options (checked as a launch checks them), plan and place in the run: its steps from its
    length (tokens: positions trained, global batch x max_seq_length per step, rounded up). ``planner``: the
    launcher's plan for a config and its flags."""
    resolved: list[tuple[PhaseSpec, list[str], int]] = []
    for spec in specs:
        phase_argv = [*argv, *phase_flags(spec)]
        resolved.append((spec, phase_argv, phase_steps(spec, phase_argv, environ, planner)))
    total = sum(steps for *_, steps in resolved)
    decay = sum(steps for spec, _, steps in resolved if spec.decay) or None
    phases, start = [], 0
    for index, (spec, phase_argv, steps) in enumerate(resolved):
        end = start + steps
        facts = PhaseFacts(index, len(resolved), spec.name, start, end, total, decay)
        final_argv = [*phase_argv, "--max_steps", str(end)]
        config = launcher_config(final_argv, environ)
        plan = with_phase(planner(config, final_argv), facts)
        phases.append(PlannedPhase(facts, spec.options, final_argv, config, plan))
        start = end
    return phases


def phase_steps(
    spec: PhaseSpec,
    phase_argv: Sequence[str],
    environ: Mapping[str, str],
    planner: Callable[[Config, Sequence[str]], Plan],
) -> int:
    """A phase's optimizer steps: given, or its tokens over the positions one step trains (which only a plan of the
    phase's own options knows: its batch on this machine)."""
    if spec.steps is not None:
        return spec.steps
    config = launcher_config(phase_argv, environ)
    if config.schedule.batch_warmup_ratio > 0:  # its smaller first steps would train fewer tokens than the phase says
        raise ConfigError(
            f"phase {spec.name}: a length in tokens counts full batches, and {config.source_of('batch_warmup_ratio')}"
            f"={config.schedule.batch_warmup_ratio:g} makes the first steps smaller; give the phases' lengths in "
            "steps, or no batch warm-up"
        )
    per_step = planner(config, phase_argv).batch.global_batch_size
    if per_step is None:
        raise ConfigError(
            f"phase {spec.name}: tokens need a fixed global batch; with an elastic number of nodes give steps"
        )
    positions = per_step * config.data.max_seq_length
    return max(1, math.ceil((spec.tokens or 0) / positions))


def with_phase(plan: Plan, facts: PhaseFacts, started: float | None = None) -> Plan:
    """The plan with the phase in its hand-off to the ranks; ``started``: when a phase after the first began (the
    launch its start-up and its quality curve count from, as a resumed session's own; the first phase's is the
    launcher's start)."""
    handoff = Handoff.from_environ(plan.env)
    if handoff is None:  # every plan the launcher makes carries one
        return plan
    handoff = replace(handoff, phase=facts.record(), launched_at=started or handoff.launched_at)
    return replace(plan, env={**plan.env, HANDOFF_ENV: handoff.to_env()})


def run_phases(
    phases: Sequence[PlannedPhase], done: int, log: Callable[[str], object], start: Callable[[PlannedPhase], int]
) -> int:
    """Each phase not yet trained (``done``: the newest checkpoint's step), in order, until one fails or stops.
    ``start`` plans the phase again as it starts (its launch time is then its own: the start-up it records, and
    the clock its quality curve counts from, as a resumed session's) and runs it."""
    for phase in phases:
        facts = phase.facts
        if facts.end <= done:
            log(f"{facts.line()}: trained already (checkpoint at step {done})")
            continue
        log(facts.line() + (f", resuming at step {done}" if done > facts.start else ""))
        code = start(phase)
        if code != 0:
            return code
    return 0


def phases_document(phases: Sequence[PlannedPhase]) -> list[dict]:
    """``plan``'s phases: each one's place in the run and the options it changes."""
    return [{**phase.facts.record(), "options": phase.options} for phase in phases]
