"""What we borrow from torchrun's output (torch 2.15, ``torch/distributed/elastic/``): the text of its agent's
failure report, read by the launcher's stderr relay (train/launch/torchrun.py). The agent's exit status is 1
whatever a rank did, and its error file (``TORCHELASTIC_ERROR_FILE``) is written only by a rank that raised, never
for one that died of a signal: the report's text is the one place torchrun says which rank a signal killed."""

from __future__ import annotations

import re

from train.borrowed.touch import borrows

_AGENT_REPORT = re.compile(rb"^[EWI]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ .*torch/distributed/elastic/.*\] failed")
_ROOT_CAUSE = re.compile(rb"Root Cause.*?rank\s*:\s*([0-9]+).*?exitcode\s*:\s*(-[0-9]+)", re.S)
_SIGNAL_EXCEPTION = b"torch.distributed.elastic.multiprocessing.api.SignalException"


@borrows("torch", "2.15", "distributed/elastic/multiprocessing/api.py PContext.close / _poll, logger.error")
def agent_reports_a_failure(line: bytes) -> bool:
    """Whether ``line`` starts the agent's report of a failed rank: its ERROR log line ("E1130 12:00:00.000 123
    .../api.py:1002] failed (exitcode: 2) local_rank: ..." in torch 2.15: ``torch/distributed/elastic/
    multiprocessing/api.py`` logs "failed (exitcode: %s)", ``torch/_logging/_internal.py`` TorchLogsFormatter
    prefixes it). What follows it (its traceback and summary table) is held back until the exit code says whether a
    rank already said what went wrong. torchrun has no option to leave the report out."""
    return _AGENT_REPORT.match(line) is not None


@borrows("torch", "2.15", "distributed/elastic/multiprocessing/api.py SignalException")
def is_agent_signal_exception(line: bytes) -> bool:
    """Whether ``line`` is the last line of the traceback the agent ends with when it stops on a signal (torch 2.15,
    ``torch/distributed/elastic/multiprocessing/api.py``, ``SignalException``): dropped when the ranks said why they
    stopped. Raised by torchrun's own handler, with no option to keep it quiet."""
    return _SIGNAL_EXCEPTION in line


@borrows("torch", "2.15", "distributed/elastic/multiprocessing/errors/__init__.py ChildFailedError.format_msg")
def rank_killed_by_signal(report: bytes) -> tuple[int, int] | None:
    """The rank and the signal number of the agent's root cause, when that rank died of a signal; None otherwise
    (torch 2.15: ``torch/distributed/elastic/multiprocessing/errors/__init__.py``, the "Root Cause (first observed
    failure)" section ``ChildFailedError.format_msg`` writes, with "rank : 1 (local_rank: 1)" and "exitcode : -9").
    Neither torchrun's exit status nor its error file names a rank killed by a signal."""
    found = _ROOT_CAUSE.search(report)
    if not found:
        return None
    return int(found.group(1)), -int(found.group(2))
