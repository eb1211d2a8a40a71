"""The option reference, from the schema: docs/options.md's table (tools/options.py writes it) and what
``./entrypoint.sh help options`` prints. Our options and the Trainer's we set a default for, by default; every
TrainingArguments field too with ``every=True`` (the Trainer's own help)."""

from __future__ import annotations

import textwrap

from transformers import HfArgumentParser

from train.config.parser import build_parser, option_actions
from train.config.schema import JOB_FIELDS, PROJECT_DEFAULTS, env_name


def option_rows(parser: HfArgumentParser | None = None, job_only: bool = False) -> list[tuple[str, str, str, str]]:
    """(name, env var, default, help) for each option (``job_only``: ours and those we give a default)."""
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


def options_text(every: bool = False, width: int = 100) -> str:
    """The options as text, one entry each: ``--name`` / ``MLM_NAME`` (default), then its help, indented."""
    rows = option_rows(job_only=not every)
    which = "every option, the Trainer's included" if every else "our options and the Trainer's we set a default for"
    lines = [
        f"mlm-trainer options: {which} ({len(rows)}). Each is a flag, an MLM_* variable or a YAML key; "
        "flags win over variables, variables over the preset. Reference: docs/options.md.",
    ]
    if not every:
        lines.append("Every TrainingArguments field is an option too: `help options --all` lists them.")
    for name, env, default, help_text in rows:
        lines += ["", f"--{name}  {env}" + (f"  (default: {default})" if default else "")]
        lines += textwrap.wrap(help_text, width, initial_indent="    ", subsequent_indent="    ") if help_text else []
    return "\n".join(lines)
