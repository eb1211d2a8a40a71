"""``python -m train [train|plan] [option flags]``: the launcher, as ``entrypoint.sh`` runs it."""

from train.common.errors import exit_process, run_main
from train.launch.__main__ import main

exit_process(run_main(main))
