"""Reading the cluster's variables (PET_*, NNODES, SLURM_*, ...): the first of several names that is set, and an
integer within bounds, each error naming the variable it came from. topology.py and slurm.py both read this way."""

from __future__ import annotations

from collections.abc import Mapping

from train.common.errors import ConfigError
from train.config import shown


def first_set(environ: Mapping[str, str], *names: str) -> tuple[str, str] | tuple[None, None]:
    """(value, name) of the first of ``names`` that is set, its value stripped; (None, None) when none is. A
    variable set to blanks counts as unset."""
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return value, name
    return None, None


def integer(value: str, source: str, minimum: int = 0, maximum: int | None = None) -> int:
    """``value`` as an integer from ``minimum`` (to ``maximum``); a ConfigError naming ``source`` otherwise."""
    expected = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{source}={shown(value)}: expected {expected}") from None
    if number < minimum or (maximum is not None and number > maximum):
        raise ConfigError(f"{source}={shown(value)}: expected {expected}")
    return number
