"""A doctor row and how rows reach a person (a table, coloured on a terminal) or a program (one JSON document)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

OK, WARN, FAIL, SKIP = "OK", "WARN", "FAIL", "SKIP"
COLOURS = {OK: "32", WARN: "33", FAIL: "31", SKIP: "2"}


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)  # the facts behind the row, for the JSON document


def failed(checks: list[Check]) -> bool:
    return any(c.status == FAIL for c in checks)


def format_table(checks: list[Check], colour: bool = False) -> str:
    width = max(len(c.name) for c in checks)
    lines = [f"{'CHECK'.ljust(width)}  STATUS  DETAIL"]
    for check in checks:
        status = check.status.ljust(6)
        if colour:
            status = f"\033[{COLOURS[check.status]}m{status}\033[0m"
        lines.append(f"{check.name.ljust(width)}  {status}  {check.detail}")
        if check.fix and check.status in (WARN, FAIL):
            lines.append(f"{' ' * width}          fix: {check.fix}")
    fails = sum(c.status == FAIL for c in checks)
    warns = sum(c.status == WARN for c in checks)
    if fails:
        lines.append(f"\n{fails} FAIL, {warns} WARN: fix the FAIL rows before starting the job.")
    else:
        lines.append(f"\nNothing blocks the job ({warns} WARN).")
    return "\n".join(lines)


def render(checks: list[Check], log_format: str, colour: bool = False) -> str:
    """``json``: one document; ``text``: the table."""
    if log_format == "json":
        return json.dumps({"checks": [asdict(c) for c in checks], "ok": not failed(checks)}, default=str)
    return format_table(checks, colour=colour)
