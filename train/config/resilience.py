"""The resilience section: a loss spike or a non-finite step rolled back to the last good checkpoint, its bound,
and the fault drills that rehearse it (``MLM_INJECT_FAULT``). The grammar of a drill is here, pure, so that the
option's check (train/config/validate.py) and the drills themselves (train/run/drills.py) read it alike."""

from __future__ import annotations

import re
from dataclasses import dataclass

from train.common.progress import FLOOR_S, GAP_FACTOR, SAVE_MARGIN_S
from train.config.bounds import NON_NEGATIVE, Bound, Section, integers, option

FAULT_KINDS = ("nan", "spike", "hang", "slow")
FAULT = re.compile(r"(nan|spike|hang)@([0-9]+)(?::([0-9]+))?")
SLOW = re.compile(r"slow@([0-9]+):([0-9]+(?:\.[0-9]+)?)")  # a rank slowed from the start, by a factor above 1
FAULT_FORM = (
    "nan@STEP, spike@STEP or hang@STEP (STEP from 1; :RANK after it for one world rank), or slow@RANK:FACTOR (FACTOR "
    "above 1), several separated by commas"
)
MAX_ROLLBACKS = 1000
# An explicit hang bound below this would take a slow first evaluation batch or a log write for a hang.
MIN_HANG_TIMEOUT_S = 10


@dataclass(frozen=True)
class Fault:
    """One injected fault: ``kind`` (nan: the step's loss becomes NaN; spike: the step's parameter update is
    multiplied after clipping; hang: the rank stops making progress, without exiting) at optimizer step ``step``
    (the Trainer's count, from 1), on every rank or on world rank ``rank`` alone; or slow: world rank ``rank``'s
    steps take ``factor`` times as long, from the first (``step`` 1)."""

    kind: str
    step: int
    rank: int | None = None
    factor: float = 1.0

    @property
    def name(self) -> str:
        """As the option writes it, and as run.json records what fired."""
        if self.kind == "slow":
            return f"slow@{self.rank}:{self.factor:g}"
        return f"{self.kind}@{self.step}" + (f":{self.rank}" if self.rank is not None else "")

    def hits(self, rank: int) -> bool:
        return self.rank is None or self.rank == rank


def parse_faults(text: str | None) -> tuple[Fault, ...] | None:
    """The faults ``MLM_INJECT_FAULT`` names (none for an unset or empty option), or None where it does not read
    as FAULT_FORM (a step 0, a repeated fault)."""
    if text is None or not text.strip():
        return ()
    faults = []
    for item in text.split(","):
        slow = SLOW.fullmatch(item.strip())
        if slow is not None:
            if float(slow.group(2)) <= 1:
                return None
            faults.append(Fault("slow", 1, int(slow.group(1)), float(slow.group(2))))
            continue
        found = FAULT.fullmatch(item.strip())
        if found is None or int(found.group(2)) < 1:
            return None
        rank = found.group(3)
        faults.append(Fault(found.group(1), int(found.group(2)), int(rank) if rank is not None else None))
    return tuple(faults) if len({f.name for f in faults}) == len(faults) else None


FAULTS = Bound(lambda v: parse_faults(v) is not None, FAULT_FORM)


@dataclass
class ResilienceArguments(Section):
    """What a run does when its loss or gradient norm stops being finite or spikes, and the drills rehearsing it."""

    spike_rollbacks: int = option(
        3,
        "Rollbacks a run may make: a non-finite loss or gradient norm, non-finite weights, or a spike (spike_"
        "threshold) rolls every rank back to the newest complete checkpoint before it, skips the batches that led "
        "into it, and trains on (docs/outputs.md); one past the bound ends the run, exit 2. 0: no rollback, a "
        "non-finite step ends the run (exit 2) and a spike is only said.",
        integers(0, MAX_ROLLBACKS),
    )
    spike_threshold: float = option(
        8.0,
        "How far above its recent level a logged loss or gradient norm is a spike: its robust z-score (distance "
        "from the median of the last 50 logged values, in median absolute deviations scaled to a standard "
        "deviation) above this, and at least 1.25 (a loss) or 4 (a gradient norm) times that median, after 10 logged "
        "steps; a loss at least 0.5 above it, a gradient norm only without clipping (max_grad_norm 0); 0: only a "
        "value that is not finite rolls back.",
        NON_NEGATIVE,
    )
    spike_lr_factor: float = option(
        1.0,
        "Each rollback multiplies the peak learning rate of the schedule it goes back to by this (0.5: half; the "
        "checkpoints after it save the scaled schedule, so a second rollback to one of them halves it again); "
        "1: the rate as it was.",
        Bound(lambda v: 0 < v <= 1, "a number above 0, at most 1"),
    )
    inject_fault: str | None = option(
        None,
        "A fault drill: nan@STEP makes that optimizer step's loss NaN, spike@STEP multiplies that step's parameter "
        "update by 10,000 after clipping; :RANK after the step for one world rank only (nan@40:1); several separated "
        "by commas; hang@STEP:RANK makes that rank stop at that step's start without exiting (the hang watchdog's "
        "drill: hang_timeout); slow@RANK:FACTOR makes that world rank's steps take FACTOR times as long, from the "
        "first (the straggler warning's drill). Each fires once in a run (output_dir's faults-fired.json: a rollback "
        "or a restart does not fire it again; slow is on in every launch). The banner and run.json say a drill is "
        "on; refused with push_to_hub.",
        FAULTS,
    )
    hang_timeout: int = option(
        0,
        "Seconds without progress (a training step, an evaluation batch, a finished save) after which the launcher "
        "takes the run for hung: each rank's Python stack goes to output_dir/logs/stacks-rank-N.txt, one line names "
        "the rank(s) that stopped and where, every process of the node is ended, exit 76 (retryable: the same "
        "command resumes from the last checkpoint; docs/launching.md). 0: derived from the run itself, "
        f"{GAP_FACTOR} times the longest gap between two progress events so far, at least {FLOOR_S:.0f} s. Before a "
        "rank's first step, and while it saves the final model or publishes it, it is not watched (ddp_timeout bounds "
        f"what waits for it). A checkpoint's save has its own bound: {SAVE_MARGIN_S:.0f} s less than ddp_timeout, or "
        f"{GAP_FACTOR} times the longest save so far if less, at least {FLOOR_S:.0f} s, never below hang_timeout.",
        Bound(lambda v: v == 0 or v >= MIN_HANG_TIMEOUT_S, f"0 (derived) or at least {MIN_HANG_TIMEOUT_S}"),
    )
