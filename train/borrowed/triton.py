"""What we borrow from triton (written against triton 3.9, the one torch 2.15's CUDA build pins): the name of its
compiled extension module, and the text of the leak report its nanobind bindings print when a process exits with
their objects alive. Imports nothing: the launcher asks before it exits, and triton is heavy."""

from __future__ import annotations

import re
import sys

from train.borrowed.touch import borrows

TRITON_BINDINGS = "triton._C.libtriton"
# How each line of nanobind's report starts: "nanobind: leaked 4 instances!", " - leaked type "...", " - ... skipped
# remainder", "nanobind: this is likely caused by ...". Its last line has no newline: what the stream carries next
# (torchrun's own log line) is glued to it.
_LEAK_REPORT = (b"nanobind: ", b" - leaked ", b" - ... skipped remainder")
_LEAK_REPORT_LAST = b"See https://nanobind.readthedocs.io/"
_LEAK_REPORT_END = re.compile(re.escape(_LEAK_REPORT_LAST) + rb"\S*?refleaks\.html")


@borrows("triton", "3.9", "python/triton/_C/libtriton (the nanobind extension module built from python/src/main.cc)")
def triton_bindings_loaded() -> bool:
    """Whether triton's nanobind bindings are loaded in this process (triton 3.9's private extension module
    ``triton._C.libtriton``; torch 2.15 imports triton with torch._dynamo, which transformers 5.25's model loading
    imports). nanobind counts the objects still alive when its bindings are torn down and prints a "leaked" line
    for each: a process that leaves its objects to the operating system (train/common/errors.py exit_process,
    ``gc.freeze``) prints that report once they are loaded. triton has no public way to say whether its bindings
    are loaded."""
    return TRITON_BINDINGS in sys.modules


@borrows("triton", "3.9", "nb_internals.cpp (nanobind's internals_cleanup, linked into triton._C.libtriton)")
def leak_report_part(line: bytes) -> int:
    """How many of ``line``'s first bytes belong to the leak report nanobind prints as a process that froze its
    objects (``gc.freeze``: train/common/errors.py exit_process) tears triton's bindings down: objects left to the
    operating system, not leaks. All of a line of the report; of its last line ("See https://nanobind.readthedocs.io
    /.../refleaks.html", which nanobind ends without a newline), the URL, and the line glued after it stays. 0 for
    any other line. The launcher's stderr relay drops that part (train/launch/torchrun.py). nanobind's switch for
    the report (``nb::set_leak_warnings``) is C++ only, and triton 3.9 does not call it (nanobind's
    ``nb_internals.cpp``, ``internals_cleanup``, prints it)."""
    if line.startswith(_LEAK_REPORT):
        return len(line)
    end = _LEAK_REPORT_END.match(line)
    return end.end() if end else 0


def may_become_leak_report(partial: bytes) -> bool:
    """Whether ``partial``, the start of a line whose end has not arrived yet, may still turn out to start with the
    report (``leak_report_part``): the relay holds it until the line is whole."""
    return any(partial[: len(start)] == start[: len(partial)] for start in (*_LEAK_REPORT, _LEAK_REPORT_LAST))
