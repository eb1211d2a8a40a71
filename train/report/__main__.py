"""``python -m train.report OUTPUT_DIR`` (``entrypoint.sh report OUTPUT_DIR``): write the run's report.

``main`` lives here and is not re-exported by the package: ``python -m`` would otherwise find this module already
imported by train/report/__init__.py and warn (runpy's RuntimeWarning), as train/doctor/__main__.py avoids too.
"""

from __future__ import annotations

import argparse
import sys

from train.common.console import say
from train.common.errors import exit_process, run_main
from train.outputs.runfiles import RunFiles
from train.report.page import write_report


def main(argv: list[str] | None = None) -> int:
    """Write OUTPUT_DIR/report.html and loss.png; exit 2 (ConfigError, through run_main) without logs."""
    parser = argparse.ArgumentParser(
        prog="entrypoint.sh report", description="Write OUTPUT_DIR/report.html and OUTPUT_DIR/loss.png."
    )
    parser.add_argument("output_dir", metavar="OUTPUT_DIR", help="the output_dir of a finished or interrupted run")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, message already printed by argparse)
        return int(exc.code or 0)
    files = RunFiles(args.output_dir)
    write_report(files.root)
    say(f"report: {files.report} (and {files.loss_png})")
    return 0


if __name__ == "__main__":
    exit_process(run_main(main))
