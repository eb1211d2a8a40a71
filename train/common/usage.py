"""What ``help``, ``-h`` and ``--help`` answer, for the front door and every sub-command: a short usage, exit 0.

One table of the sub-commands, so that the general help, each command's own and the README's table say the same
(tests/test_help.py compares them). The full option list is the config's (``help options``:
train/config/reference.py), generated from the schema as docs/options.md is.
"""

from __future__ import annotations

import difflib
import sys
import textwrap
from collections.abc import Sequence

from train.common.errors import ConfigError, exit_process, run_main

NAME = "mlm-trainer"
HELP_WORDS = ("-h", "--help")
NOT_A_COMMAND = "--not-a-command"  # entrypoint.sh's flag for a first word it cannot run (not a topic: a dash)
WIDTH = 110

# (command and its arguments, what it does): the order of the README's table.
COMMANDS = {
    "train": ("train [--option value ...]", "train (the default: no command means train)"),
    "plan": ("plan [--option value ...]", "print the launch plan as JSON: GPUs, processes, precision; trains nothing"),
    "evaluate": (
        "evaluate [--option value ...]",
        "score a model or checkpoint (MLM_MODEL_NAME_OR_PATH) on the held-out text; writes eval_results.json",
    ),
    "finetune": (
        "finetune --task DIR [--option value ...]",
        "fine-tune a model or checkpoint on a labelled classification task, over seeds; writes finetune_results.json",
    ),
    "replay": (
        "replay RUN_JSON [--output_dir DIR] [--anyway] [--option value ...]",
        "run a finished run's recipe again; refused where something differs; says if final/ is identical",
    ),
    "branch": (
        "branch CHECKPOINT_OR_URL --output_dir DIR [--option value ...]",
        "a new run from a checkpoint's weights, optimizer and step, with options changed (another decay or mixture)",
    ),
    "prepare": ("prepare [--option value ...]", "tokenize the corpus into the cache (HF_HOME); trains nothing"),
    "gpus": ("gpus [--json]", "list the GPUs this container can use"),
    "doctor": ("doctor [--option value ...]", "preflight checks of the next run's options, before a long job"),
    "report": ("report OUTPUT_DIR", "write report.html and loss.png for a finished or interrupted run"),
    "verify": ("verify DIR_OR_URL", "check a final model or a checkpoint against its files' sizes and SHA-256"),
    "average": (
        "average DIR DIR... --output_dir OUT [--weights W,W,...]",
        "average final models' or checkpoints' weights into OUT/final (verified inputs, one architecture)",
    ),
    "help": ("help [COMMAND | options | options --all]", "this text; one command's; the options"),
}

OPTIONS_NOTE = (
    "Options: a flag (--learning_rate 3e-4), an environment variable (MLM_LEARNING_RATE=3e-4) or a key of a YAML "
    "preset (--config FILE / MLM_CONFIG); flags win over variables, variables over the preset. "
    "`help options` lists them (docs/options.md); exit codes: docs/exit-codes.md."
)


def wants_help(args: Sequence[str]) -> bool:
    """-h or --help anywhere among a command's arguments (no option takes either as its value)."""
    return any(arg in HELP_WORDS for arg in args)


def usage(command: str | None = None) -> str:
    """The front door's usage (``command`` None), or one sub-command's."""
    if command is not None and command in COMMANDS:
        synopsis, what = COMMANDS[command]
        lines = [f"usage: ./entrypoint.sh {synopsis}", "", f"{what[0].upper()}{what[1:]}."]
        if "--option" in synopsis:
            lines += ["", *textwrap.wrap(OPTIONS_NOTE, WIDTH)]
        return "\n".join(lines)
    width = max(len(synopsis) for synopsis, _ in COMMANDS.values())
    lines = [
        f"{NAME}: a masked-language-model training job (Hugging Face Trainer under torchrun), the same on a CPU,",
        "one GPU, eight, or many nodes.",
        "",
        "usage: ./entrypoint.sh [COMMAND] [ARGUMENTS]      in the image: docker run IMAGE [COMMAND] [ARGUMENTS]",
        "",
        "commands:",
        *(f"  {synopsis:<{width}}  {what}" for synopsis, what in COMMANDS.values()),
        "",
        *textwrap.wrap(OPTIONS_NOTE, WIDTH),
    ]
    return "\n".join(lines)


def command_help(topic: Sequence[str]) -> str:
    """``help`` and ``help COMMAND`` (``help options`` is the config's: the launcher answers it)."""
    if topic and topic[0] not in COMMANDS:
        raise ConfigError(f"help {topic[0]}: no such command or topic; expected one of {', '.join(COMMANDS)}, options")
    return usage(topic[0] if topic else None)


def not_a_command(word: str) -> str:
    """What entrypoint.sh says of a first word that is neither one of our commands nor a program it could run
    (``trian``): the nearest command, where one is near, else the list."""
    near = difflib.get_close_matches(word, COMMANDS, n=1)
    hint = f"did you mean '{near[0]}'?" if near else f"expected one of {', '.join(COMMANDS)}, or a program to run"
    return f"{word}: no such command, nor a program on PATH; {hint}"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m train.common.usage [COMMAND]``: what entrypoint.sh runs for ``help`` - this module alone, so the
    usage prints at once rather than after the launcher has imported torch and transformers (6 s here).
    ``python -m train.common.usage NOT_A_COMMAND WORD``: entrypoint.sh's one line for a word it cannot run."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == [NOT_A_COMMAND]:
        raise ConfigError(not_a_command(args[1] if len(args) > 1 else ""))
    print(command_help(args))
    return 0


if __name__ == "__main__":
    exit_process(run_main(main))
