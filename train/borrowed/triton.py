"""What we borrow from triton (written against triton 3.9, the one torch 2.15's CUDA build pins): the name of its
compiled extension module. Imports nothing: the launcher asks before it exits, and triton is heavy."""

from __future__ import annotations

import sys

from train.borrowed.touch import borrows

TRITON_BINDINGS = "triton._C.libtriton"


@borrows("triton", "3.9", "python/triton/_C/libtriton (the nanobind extension module built from python/src/main.cc)")
def triton_bindings_loaded() -> bool:
    """Whether triton's nanobind bindings are loaded in this process (triton 3.9's private extension module
    ``triton._C.libtriton``; torch 2.15 imports triton with torch._dynamo, which transformers 5.25's model loading
    imports). nanobind counts the objects still alive when its bindings are torn down and prints a "leaked" line
    for each: a process that leaves its objects to the operating system (train/common/errors.py exit_process,
    ``gc.freeze``) must not once they are loaded. triton has no public way to say whether its bindings are loaded."""
    return TRITON_BINDINGS in sys.modules
