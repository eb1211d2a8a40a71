"""``python -m train [train|plan] [option flags]``: the launcher, as ``entrypoint.sh`` runs it."""

import sys

from train.errors import run_main
from train.launch.__main__ import main

sys.exit(run_main(main))
