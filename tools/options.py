"""``python -m tools.options --write|--check FILE``: docs/options.md's option table, generated from the schema
(tools/generated.py: between two marker comments; ``make lint`` checks it, ``make options`` rewrites it)."""

from __future__ import annotations

import sys

from tools.generated import Section, cell
from train.config import SECTION_OF, option_rows


def options_table() -> str:
    """One row an option, with the section of the Config that holds it (``training``: the Trainer's own)."""
    lines = [
        "| option | section | environment variable | default | what it does |",
        "|---|---|---|---|---|",
    ]
    for name, env, default, help_text in option_rows(job_only=True):
        section = SECTION_OF.get(name, "training")
        lines.append(
            f"| `{name}` | {section} | `{env}` | {cell(f'`{default}`' if default else '')} | {cell(help_text)} |"
        )
    return "\n".join(lines)


SECTION = Section("options", "train/config/schema.py", options_table)
BEGIN, END, render, main = SECTION.begin, SECTION.end, SECTION.render, SECTION.main


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
