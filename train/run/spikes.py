"""When a logged loss or gradient norm is a spike: a pure rule over the values logged before it, unit-tested on series
(tests/run/test_spikes.py). The divergence guard (train/run/callbacks.py) asks it at every training log.

A value is a spike when it stands far above its recent level: its robust z-score (its distance from the median of the
last WINDOW healthy values, in median absolute deviations scaled to a standard deviation) above the threshold, and at
least RATIO times that median (a loss 1.25, a gradient norm 4), once MIN_HISTORY values are known; before that, a
loss EARLY_RATIO times the highest logged so far. The median and MAD
are robust: the noise of a healthy run and a single outlier barely move them. A value that falls is never a spike (a
loss that drops fast early in a run), and the deviation has a floor (FLOOR of the median) so that a series flat to the
last digit does not make its first wobble a spike. A spike is not added to the history: the next values are judged
against the level before it.

And a spike is large in absolute terms, not only against its level: a loss at least MIN_LOSS_RISE (nats) above its
median. A gradient norm's spike counts only where the gradients are not clipped (``clipped``: max_grad_norm above 0,
1.0 by default): a clipped step moves the weights no further than the clip allows, whatever the norm, and the norm
of a run that has learnt its data jumps far above its level all the time. Measured in CI's Slurm budget test (a
tiny model on the demo's 320 rows for hundreds of epochs, its loss at 0.0003-0.004): gradient norms of 0.0016-0.0056
blipped to 0.02 and, every few dozen steps, to 3.3 (550 times the level, past the clip), with no rise of the loss;
the run, rolled back on them, ended exit 2 where it had always finished. Its non-finite values count in every run."""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

WINDOW = 50  # logged values the level is the median of
MIN_HISTORY = 10  # logged values known before a spike can be called by its z-score
# Before MIN_HISTORY values (a log every 50 steps, the default, gives ten by step 500): a loss EARLY_RATIO times the
# highest logged so far. A healthy masked LM's loss falls from its first log; measured on the quality series' data
# (the tiny model, 240 steps, logs at 50 and 100: 8.21, 5.98), spike@120 logged 3,102 at step 150 and went unseen:
# the run finished with a held-out loss of 1,085 against 5.41.
EARLY_RATIO = 3.0
# A spike is at least this many times its median, whatever its z-score: a gradient norm blips to 2-3 times its
# level in a healthy run (small batches, a rare long document; the demo run's did 3x at z 5.3), a loss does not.
RATIO = {"loss": 1.25, "grad_norm": 4.0}
FLOOR = 0.01  # the deviation's floor, a share of the median
MIN_LOSS_RISE = 0.5  # nats above the median: a rise a person would call a spike (a real one: 2 to 4, or 7)
MAD_TO_SD = 1.4826  # a normal distribution's standard deviation per median absolute deviation
SERIES = ("loss", "grad_norm")


def robust_z(history: list[float], value: float) -> float:
    """How many (robust) standard deviations ``value`` stands above the median of ``history``."""
    median = statistics.median(history)
    mad = statistics.median(abs(v - median) for v in history)
    scale = max(MAD_TO_SD * mad, FLOOR * abs(median), 1e-12)
    return (value - median) / scale


@dataclass
class SpikeRule:
    """The recent level of each logged series, and the rule a new value is judged by (``threshold``: the robust
    z-score above which it is a spike; 0 or less: no spike is called, only a value that is not finite)."""

    threshold: float
    clipped: bool = False  # the gradients are clipped (max_grad_norm above 0): a gradient norm's spike is not one
    history: dict[str, deque[float]] = field(default_factory=dict)

    def judge(self, logged: dict[str, float]) -> tuple[str, str] | None:
        """(kind, what) of a logged record's values: ("non-finite", "loss is nan") or ("spike", "grad_norm 41.2
        is 9.3 robust standard deviations above its median 3.1 over the last 50 logs"), else None; healthy values
        join the history."""
        values = {key: float(logged[key]) for key in SERIES if isinstance(logged.get(key), (int, float))}
        for key, value in values.items():
            if not math.isfinite(value):
                return "non-finite", f"{key} is {value}"
        for key, value in values.items():
            spike = self.spike(key, value)
            if spike:
                return "spike", spike
        for key, value in values.items():
            self.history.setdefault(key, deque(maxlen=WINDOW)).append(value)
        return None

    def spike(self, key: str, value: float) -> str | None:
        """The words for ``value`` of series ``key`` when it is a spike, else None."""
        history = list(self.history.get(key, ()))
        if self.threshold <= 0 or not history:
            return None
        if len(history) < MIN_HISTORY:
            highest = max(history)
            if key != "loss" or value < EARLY_RATIO * highest or not self.large(key, value, highest):
                return None
            return f"{key} {value:.4g} is {value / highest:.0f} times the highest of its {len(history)} logs before"
        median, z = statistics.median(history), robust_z(history, value)
        if z <= self.threshold or value < RATIO[key] * median or not self.large(key, value, median):
            return None
        return (
            f"{key} {value:.4g} is {z:.1f} robust standard deviations above its median {median:.4g} over the last "
            f"{len(history)} logs"
        )

    def large(self, key: str, value: float, median: float) -> bool:
        """Whether ``value`` is large in absolute terms (the module's docstring): a loss MIN_LOSS_RISE above its
        median; a gradient norm where the gradients are not clipped."""
        return value - median >= MIN_LOSS_RISE if key == "loss" else not self.clipped
