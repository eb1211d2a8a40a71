"""``python -m tools.options --write|--check FILE``: docs/options.md's option table, generated from the schema
(tools/generated.py: between two marker comments; ``make lint`` checks it, ``make options`` rewrites it)."""

from __future__ import annotations

import sys

from transformers import HfArgumentParser

from tools.generated import Section, cell
from train.config import JOB_FIELDS, PROJECT_DEFAULTS, build_parser, env_name, option_actions


def option_rows(parser: HfArgumentParser | None = None, job_only: bool = False) -> list[tuple[str, str, str, str]]:
    """(name, env var, default, help) for each option: the source of docs/options.md's table."""
    parser = parser or build_parser()
    rows = []
    for name, action in option_actions(parser).items():
        if job_only and name not in JOB_FIELDS and name not in PROJECT_DEFAULTS:
            continue
        default = action.default
        if isinstance(default, list):
            default = ",".join(str(d) for d in default)
        default_text = "" if default is None else str(getattr(default, "value", default))
        help_text = " ".join((action.help or "").split())
        rows.append((name, env_name(name), default_text, help_text))
    return rows


def options_table() -> str:
    lines = [
        "| option | environment variable | default | what it does |",
        "|---|---|---|---|",
    ]
    for name, env, default, help_text in option_rows(job_only=True):
        lines.append(f"| `{name}` | `{env}` | {cell(f'`{default}`' if default else '')} | {cell(help_text)} |")
    return "\n".join(lines)


SECTION = Section("options", "train/config/schema.py", options_table)
BEGIN, END, render, main = SECTION.begin, SECTION.end, SECTION.render, SECTION.main


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
