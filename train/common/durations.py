"""Durations as people and schedulers write them: ``90m``, ``2h``, ``1h30m``, ``45s``, ``5400`` (seconds), and
Slurm's ``[days-]hours:minutes:seconds``; shown back as ``1h30m``. The standard library parses neither, and the
option (time_budget) and the Slurm time limit must read the same way. A budget may also be a moment (``until``):
an ISO 8601 time with its zone, which a submit script computes once for every node and every restart."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
SPELLED = re.compile(r"(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")
CLOCK = re.compile(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)")
SCHEDULER = "slurm"  # time_budget's word for "the Slurm job's end time" (train/launch/deadline.py)
EXPECTED = (
    f"a duration such as 90m, 2h, 1h30m, 45s, or seconds (5400), {SCHEDULER}, or a time with its zone such as "
    "2026-12-03T18:00:00Z"
)


def seconds(text: str) -> float | None:
    """``text`` in seconds, or None when it is no duration (or not a positive one)."""
    value = text.strip().lower().replace(" ", "")
    if not value:
        return None
    try:
        found: float | None = float(value)
    except ValueError:
        found = _spelled(value)
    return found if found is not None and 0 < found < math.inf else None  # float() reads "inf" and "nan"


def until(text: str) -> float | None:
    """``text`` as a moment (seconds since the epoch): an ISO 8601 date and time with its zone (``Z`` or
    ``+01:00``); None for anything else, a time without a zone included (whose clock it means would be a guess)."""
    value = text.strip()
    if "T" not in value.upper():
        return None  # a date alone, or a number: no moment
    try:
        moment = datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.timestamp() if moment.tzinfo is not None else None


def _spelled(value: str) -> float | None:
    clock = CLOCK.fullmatch(value)
    if clock:
        days, hours, minutes, secs = (int(part or 0) for part in clock.groups())
        return days * 86400.0 + hours * 3600 + minutes * 60 + secs
    match = SPELLED.fullmatch(value)
    if not match or not any(match.groups()):
        return None
    return sum(float(part) * unit for part, unit in zip(match.groups(), UNITS.values(), strict=True) if part)


def shown(secs: float) -> str:
    """``5400`` -> ``1h30m``, ``95`` -> ``1m35s``, ``42.5`` -> ``42s``: whole seconds, the largest units first."""
    left = round(secs)
    parts: list[str] = []
    for unit, size in UNITS.items():
        if left >= size or (unit == "s" and not parts):
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts)


def utc_clock(at: float) -> str:
    """A moment (seconds since the epoch) as the logs show deadlines: ``2026-12-03 17:02:10 UTC``."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
