"""Every touch of a library's internals (:class:`~train.borrowed.touch.Touch`), gathered from the modules of this
package: what tests/borrowed/test_canaries.py checks one by one, and ``python -m train.borrowed`` lists. Importing
this imports every library we borrow from (torch, transformers): the job's modules import the one they need."""

from __future__ import annotations

import importlib
import pkgutil

import train.borrowed as package
from train.borrowed.touch import Touch, registered

# Every module of the package but the machinery (this one, touch.py, __main__.py): a new module registers itself.
MODULES = tuple(
    importlib.import_module(f"{package.__name__}.{module.name}")
    for module in pkgutil.iter_modules(package.__path__)
    if module.name not in {"registry", "touch", "__main__"}
)
TOUCHES: tuple[Touch, ...] = registered()
