"""What the destinations share: reading a record the run wrote (run.json, all_results.json, the tokenizer's config)
and one line on why a request to a hub or tracker failed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from train.common.errors import first_line


def read_json(path: Path) -> dict[str, Any]:
    """A JSON record, or {} when it is missing or unreadable: publishing says what it knows rather than fail."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def why_failed(exc: BaseException) -> str:
    """One line on why a request failed: the HTTP status and the server's message, or the error's first line."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if status is not None:
        reason = getattr(response, "reason_phrase", "") or ""
        said = (getattr(exc, "server_message", None) or "").strip().splitlines()
        return f"{status} {reason}".strip() + (f": {said[0][:200]}" if said else "")
    first = first_line(exc)
    return type(exc).__name__ if first == type(exc).__name__ else f"{type(exc).__name__}: {first}"
