"""Paths that came from outside the job: one rule for every name a run did not make itself (a file a marker lists,
a module path in modules.json, a key in a bucket) and every directory someone else may have prepared (the output
directory, a handed-over model, a checkpoint).

The rule: a name stands for a path inside its directory only when it is relative, has no ``..`` (nor ``.``) part,
and no symbolic link lies on the way to it; and the job never writes through a link it finds where it writes. A
link could otherwise send a read into an output (a file copied into final/ and pushed) or a write outside the
directory (a run that starts over writing through a planted link). The directory itself may be a link (a volume
mounted through one is the user's own choice): only what lies inside it is judged.

What the standard library lacks: ``Path.resolve`` follows links instead of refusing them, and
``os.path.commonpath`` checks strings, not what the filesystem will open.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath


def name_problem(name: str) -> str | None:
    """Why ``name`` (a path relative to some directory, as a record or a store gave it) cannot stand for something
    inside that directory, or None."""
    if not isinstance(name, str) or not name or "\0" in name:
        return f"{name!r}: not a file name"
    parts = PurePosixPath(name).parts
    if name.startswith(("/", "\\")) or (parts and ":" in parts[0] and len(parts[0]) == 2):
        return f"{name}: an absolute path, not a name inside its directory"
    if any(part in ("..", ".") for part in name.replace("\\", "/").split("/")):
        return f"{name}: leads out of its directory (a '..' part)"
    return None


def link_on_the_way(directory: Path, name: str) -> Path | None:
    """The first symbolic link among ``directory / name`` and its parents below ``directory``, or None."""
    path = directory
    for part in PurePosixPath(name).parts:
        path = path / part
        if path.is_symlink():
            return path
    return None


def inside(directory: Path, name: str) -> str | None:
    """Why ``directory / name`` is not a path inside ``directory`` reached without a link, or None."""
    problem = name_problem(name)
    if problem:
        return problem
    link = link_on_the_way(directory, name)
    if link is not None:
        return f"{link.relative_to(directory).as_posix()}: a symbolic link (to {os.readlink(link)})"
    return None


def regular_file(directory: Path, name: str) -> str | None:
    """Why ``directory / name`` is not a regular file inside ``directory`` reached without a link, or None."""
    problem = inside(directory, name)
    if problem is None and not (directory / name).is_file():
        problem = f"{name}: not a regular file"
    return problem


def links_under(directory: Path) -> Iterator[Path]:
    """Every symbolic link inside ``directory``, never following one (a link to a folder is not entered)."""
    for root, folders, files in os.walk(directory, followlinks=False):
        for entry in sorted([*folders, *files]):
            path = Path(root) / entry
            if path.is_symlink():
                yield path


def first_link_under(directory: Path) -> str | None:
    """The first symbolic link inside ``directory`` as ``name (to target)``, or None."""
    link = next(links_under(directory), None)
    if link is None:
        return None
    return f"{link.relative_to(directory).as_posix()} (to {os.readlink(link)})"
