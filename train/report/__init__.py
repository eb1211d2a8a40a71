"""The training report: ``output_dir/report.html`` (one self-contained page: inline SVG charts, no external
resources) and ``output_dir/loss.png``.

    python -m train.report OUTPUT_DIR        (entrypoint.sh report OUTPUT_DIR)

Works for any run, finished or not: it reads ``logs/train.jsonl`` (falling back to the Trainer's
``trainer_state.json`` for runs without one) and ``run.json`` when present. Exit 2 when OUTPUT_DIR holds no logs.
A read-only view of the run: every file name is train/outputs/runfiles.py's, and it writes only its own two files.

    runlog.py    RunLog and load_run: the logs read back as series (the types the other modules share)
    schedule.py  the learning-rate schedule from run.json, kept only when the logged rates confirm it
    plots.py     the matplotlib charts, as inline SVG
    page.py      the HTML page and write_report (what the job calls when a run ends)
    __main__.py  the command line (``main``)

The modules import in that order, none reaching back. Importing the package loads neither matplotlib nor torch:
the charts and the schedule import them when they draw or compute.
"""

from train.report.page import render_html, write_report
from train.report.runlog import RunLog, load_run, number, read_record, status_of
from train.report.schedule import Schedule, lr_schedule

__all__ = [
    "RunLog",
    "Schedule",
    "load_run",
    "lr_schedule",
    "number",
    "read_record",
    "render_html",
    "status_of",
    "write_report",
]
