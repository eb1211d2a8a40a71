"""A results file of a command that judges a model (``evaluate``'s eval_results.json, ``finetune``'s
finetune_results.json): written by world rank 0 where the outputs live (a bucket's staging directory is mirrored),
then said once: one JSON record, or one line for a person."""

from __future__ import annotations

import json
from typing import Any

from train.common import distributed
from train.common.console import resolve_format, say
from train.outputs.base import OutputLocation
from train.outputs.record import write_json_atomic


def write_results(
    location: OutputLocation, log_format: str, name: str, results: dict[str, Any], event: str, text: str
) -> None:
    """``name`` beside the outputs (``location``) holds ``results``; the line says ``text`` and where they were
    written, in ``log_format`` (``event`` names the JSON record). Only world rank 0 writes and speaks."""
    if not distributed.is_world_zero():
        return
    path = location.files.root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, results)
    location.sync(path)
    written = f"{location.shown}/{name}"
    if resolve_format(log_format) == "json":
        print(json.dumps({"event": event, **results, "written": written}), flush=True)
    else:
        say(f"{text}; written to {written}")
