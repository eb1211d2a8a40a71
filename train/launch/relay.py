"""torchrun's stderr relayed as it comes (train/launch/torchrun.py), with what is not news held back: the agent's
failure report and its own signal traceback after a rank that already said in one line what went wrong, c10d's
reverse-DNS warnings and triton's leak report."""

from __future__ import annotations

import re
from typing import Any

from train.borrowed.torchrun import agent_reports_a_failure, is_agent_signal_exception
from train.borrowed.triton import leak_report_part, may_become_leak_report

# torchrun's agent reports a failed rank with an ERROR log line followed by its own traceback and a summary table;
# and when it stops on a signal it ends with the traceback of its own SignalException (their text:
# train/borrowed/torchrun.py). When the ranks exited with a documented code they have already printed the one line
# a user needs, so both are held back and dropped.
_TRACEBACK = b"Traceback (most recent call last):"
# Python's words between the tracebacks of a chain: a stop signal that lands while the agent handles another
# exception (torch 2.15: a logging call's cache miss, KeyError) ends in a chain whose last exception is the signal's.
_CHAINED = (
    b"During handling of the above exception, another exception occurred:",
    b"The above exception was the direct cause of the following exception:",
)
# c10d warns on every connection whose peer has no reverse DNS name, which is the rule in containers and network
# namespaces ("W... socket.cpp:...] [c10d] The hostname of the client socket cannot be retrieved. err=-3"): news to
# nobody, and not a JSON line in JSON mode. Dropped (MLM_DEBUG=1 keeps them), as is the leak report triton's bindings
# print after a rank's last word (train/common/errors.py exit_process).
_NOISE = re.compile(rb"\[c10d\] The hostname of the client socket cannot be retrieved")


class StderrRelay:
    """Passes torchrun's stderr through as it comes, holding back the agent's failure report and its signal
    traceback until the exit code says whether they are news."""

    def __init__(self, sink: Any, keep_noise: bool = False) -> None:
        self.sink = sink
        self.keep_noise = keep_noise
        self.partial = b""
        self.held: list[bytes] = []
        self.reporting = False  # inside the agent's failure report: everything up to the exit is part of it
        self.traceback: list[bytes] | None = None  # a traceback being read: shown once it turns out not torchrun's
        self.exception = b""  # its last exception line so far ("" while a traceback of the chain is still open)

    def _line(self, line: bytes) -> None:
        if not self.keep_noise and _NOISE.search(line):
            return
        if not self.keep_noise and (dropped := leak_report_part(line)):
            if line[dropped:].strip():  # a line glued to the report's last one, which has no newline
                self._line(line[dropped:])
            return
        if self.reporting or (self.traceback is None and agent_reports_a_failure(line)):
            # Only the report holds back what follows it; a held SignalException traceback does not (a second
            # stop signal, e.g. Slurm's to every process of the step, can land while the agent logs: the ranks'
            # own lines after it must still come through).
            self.reporting = True
            self.held.append(line)
        elif self.traceback is not None:
            if self.exception and line.strip() and not line.startswith(_TRACEBACK) and line.strip() not in _CHAINED:
                self._end_traceback()  # the chain ended with the exception line before this one
                self._line(line)
                return
            self.traceback.append(line)
            if line.startswith(_TRACEBACK) or line.strip() in _CHAINED:
                self.exception = b""
            elif line.strip() and not line[:1].isspace():  # an exception line: the chain may go on after it
                self.exception = line
        elif line.startswith(_TRACEBACK):
            self.traceback = [line]
        else:
            self.sink.write(line)

    def _end_traceback(self) -> None:
        """A whole chain of tracebacks: held back when its last exception is the agent's stop signal."""
        block, self.traceback, last, self.exception = self.traceback or [], None, self.exception, b""
        if is_agent_signal_exception(last):
            self.held += block
        else:
            self.sink.write(b"".join(block))

    def feed(self, chunk: bytes) -> None:
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            self._line(line + b"\n")
        # Progress bars redraw with \r and no newline: show them now, unless this may start a held line.
        if self.partial and not self.reporting and self.traceback is None and not self._may_be_held(self.partial):
            self.sink.write(self.partial)
            self.partial = b""
        self.sink.flush()

    def _may_be_held(self, partial: bytes) -> bool:
        """Whether a line whose end has not arrived may turn out to be held back or dropped: a log line of torchrun's
        agent (its level's letter first) or a line of the leak report."""
        return re.match(rb"[EWIT]", partial) is not None or (not self.keep_noise and may_become_leak_report(partial))

    def finish(self, drop_report: bool) -> None:
        if self.partial:
            self._line(self.partial)
            self.partial = b""
        if self.traceback is not None and self.exception:
            self._end_traceback()
        elif self.traceback is not None:  # cut off: not a report, show it
            self.sink.write(b"".join(self.traceback))
        if not drop_report:
            self.sink.write(b"".join(self.held))
        self.sink.flush()
