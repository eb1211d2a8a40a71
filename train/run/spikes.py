"""When a logged loss or gradient norm is a spike: a pure rule over the values logged before it, unit-tested on series
(tests/run/test_spikes.py). The divergence guard (train/run/callbacks.py) asks it at every training log.

A value is a spike when it stands far above its recent level: its robust z-score (its distance from the median of the
last WINDOW healthy values, in median absolute deviations scaled to a standard deviation) above the threshold, and at
least RATIO times that median (a loss 1.25, a gradient norm 4), once MIN_HISTORY values are known. The median and MAD
are robust: the noise of a healthy run and a single outlier barely move them. A value that falls is never a spike (a
loss that drops fast early in a run), and the deviation has a floor (FLOOR of the median) so that a series flat to the
last digit does not make its first wobble a spike. A spike is not added to the history: the next values are judged
against the level before it."""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

WINDOW = 50  # logged values the level is the median of
MIN_HISTORY = 10  # logged values known before a spike can be called
# A spike is at least this many times its median, whatever its z-score: a gradient norm blips to 2-3 times its
# level in a healthy run (small batches, a rare long document; the demo run's did 3x at z 5.3), a loss does not.
RATIO = {"loss": 1.25, "grad_norm": 4.0}
FLOOR = 0.01  # the deviation's floor, a share of the median
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
        if self.threshold <= 0 or len(history) < MIN_HISTORY:
            return None
        median, z = statistics.median(history), robust_z(history, value)
        if z <= self.threshold or value < RATIO[key] * median:
            return None
        return (
            f"{key} {value:.4g} is {z:.1f} robust standard deviations above its median {median:.4g} over the last "
            f"{len(history)} logs"
        )
