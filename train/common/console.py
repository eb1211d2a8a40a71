"""How a line reaches a person or a log collector: the ``mlm-trainer:`` prefix, levels, timestamps, and whether
the console speaks text or JSON lines. Every module that talks to the user goes through here.

``auto`` is resolved once, by the launcher, on its own stdout (text on a terminal, JSON otherwise) and handed to
the ranks as ``--log_format text|json``: a rank's stdout is a pipe whenever torchrun filters or tees output.
"""

from __future__ import annotations

import json
import math
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

PREFIX = "mlm-trainer"


def now() -> str:
    """The timestamp every record and file carries: UTC, ISO 8601, whole seconds."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def jsonable(value: Any) -> Any:
    """JSON has no NaN or infinity; a diverged loss must still be visible, so they are kept as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item"):  # a 0-d tensor or numpy scalar
        return jsonable(value.item())
    return str(value)


def first_few(names: list[str], shown: int = 3) -> str:
    """A list a line can hold: the first ``shown`` names, then how many more there are."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def resolve_format(log_format: str, stream: TextIO | None = None) -> str:
    """``text`` or ``json``: ``auto`` means text when ``stream`` (default stdout) is a terminal."""
    if log_format in ("text", "json"):
        return log_format
    stream = sys.stdout if stream is None else stream
    try:
        return "text" if stream.isatty() else "json"
    except (AttributeError, ValueError):  # closed or not a real stream
        return "json"


def line(message: str, level: str = "info") -> str:
    """``mlm-trainer: message`` for info, ``mlm-trainer: warning: message`` otherwise."""
    return f"{PREFIX}: {'' if level == 'info' else level + ': '}{message}"


def say(message: str, level: str = "info") -> None:
    """One line on stderr, for a person (a rank's own lines; the launcher uses :class:`Console`)."""
    print(line(message, level), file=sys.stderr, flush=True)


def warn(message: str) -> None:
    say(message, "warning")


def error(message: str) -> None:
    say(message, "error")


class Console:
    """The launcher's voice: one line per event on stderr, text for a person or a JSON record (event ``launch``)
    for a log collector, in the format resolved for the whole run."""

    def __init__(self, log_format: str, stream: TextIO | None = None) -> None:
        self.json = log_format == "json"
        self.stream = stream

    def __call__(self, message: str, level: str = "info") -> None:
        if self.json:
            text = json.dumps({"event": "launch", "time": now(), "level": level, "message": message})
        else:
            text = line(message, level)
        print(text, file=self.stream or sys.stderr, flush=True)

    def warning(self, message: str) -> None:
        self(message, "warning")
