"""What we borrow from Python's standard library (written against CPython 3.11): argparse's list of actions and
atexit's handler list."""

from __future__ import annotations

import argparse
import atexit

from train.borrowed.touch import borrows


@borrows("python", "3.11", "Lib/argparse.py _ActionsContainer._actions")
def argparse_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every action of ``parser``, in the order they were added (CPython 3.11, ``Lib/argparse.py``,
    ``_ActionsContainer._actions``, the list ``add_argument`` appends to and ``parse_args`` reads). The schema's
    parser retypes and rewords actions HfArgumentParser built from the dataclasses (train/config/parser.py), and
    the option table lists them. argparse has no public way to list a parser's actions."""
    return parser._actions


@borrows("python", "3.11", "Modules/atexitmodule.c atexit._clear")
def forget_exit_handlers() -> None:
    """Drop every registered exit handler of this process (CPython 3.11, ``Modules/atexitmodule.c``,
    ``atexit._clear``). torchrun's agent runs in a fork of the launcher (train/launch/torchrun.py): the handlers
    registered before the fork are the launcher's libraries' (its temporary files, its logging) and must not run
    in the agent. ``atexit.unregister`` needs each function, which the libraries do not hand out."""
    atexit._clear()


@borrows("python", "3.11", "Modules/atexitmodule.c atexit._run_exitfuncs")
def run_exit_handlers() -> None:
    """Run the exit handlers registered so far, as interpreter exit would (CPython 3.11,
    ``Modules/atexitmodule.c``, ``atexit._run_exitfuncs``). The forked torchrun agent leaves through ``os._exit``
    (so nothing of the launcher's stack runs in it), which skips them: the agent's own handlers run here.
    atexit has no public way to run them short of exiting normally."""
    atexit._run_exitfuncs()
