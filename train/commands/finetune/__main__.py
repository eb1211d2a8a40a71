"""``python -m train.commands.finetune [--option value ...]``: what the launcher runs under torchrun for
``./entrypoint.sh finetune`` (train/commands/finetune/command.py)."""

from train.commands.finetune.command import main
from train.common.distributed import run_and_exit

if __name__ == "__main__":
    run_and_exit(main)
