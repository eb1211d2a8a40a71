"""The record of one touch of a library's internals, and how the modules of this package register theirs."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Touch:
    """One touch: ``name`` (``module.qualname`` inside train/borrowed/, the canary's key), the ``library`` and the
    ``version`` it was written against, the ``upstream`` file (and function) it mirrors or reaches into, and
    ``why`` (its docstring: why it is needed, what public API is missing)."""

    name: str
    library: str
    version: str
    upstream: str
    why: str


_REGISTERED: list[Touch] = []


def borrows(library: str, version: str, upstream: str) -> Callable[[T], T]:
    """Register the decorated function, class or method as a touch of ``library`` ``version``'s ``upstream``."""

    def register(obj: T) -> T:
        module = getattr(obj, "__module__", "").rsplit(".", 1)[-1]
        name = f"{module}.{getattr(obj, '__qualname__', '')}"
        _REGISTERED.append(Touch(name, library, version, upstream, inspect.getdoc(obj) or ""))
        return obj

    return register


def registered() -> tuple[Touch, ...]:
    """Every touch registered by the modules imported so far (train/borrowed/registry.py imports them all)."""
    return tuple(_REGISTERED)
