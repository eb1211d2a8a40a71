"""What the job borrows from libraries' internals, in one place: every use of a library's private name, every
override of a library's private method, every patch of a library's module or object, one module per library.

Each touch is a small named function or class whose docstring says the library version it was written against, the
upstream file (and function) it mirrors or reaches into, why it is needed and what public API is missing; the
registry (:data:`train.borrowed.registry.TOUCHES`) lists them, and tests/borrowed/test_canaries.py holds one canary
per touch that fails, naming the touch and its version, when the library changes what it relies on. Nothing here
imports ``train.*`` outside this package; nothing outside it reaches a library's private name (tests/test_layout.py).

This package's ``__init__`` imports nothing: each module pays only for its own library.
"""
