"""A stream resumed on another number of ranks: the positions the old ranks saved, redistributed to the new ones so
that no example is trained twice or skipped.

What the libraries lack (torchdata 0.11, datasets 5.2): a StatefulDataLoader's state resumes the loader that wrote
it, on the same rank of the same world size with the same workers; datasets' ``split_dataset_by_node`` gives each
rank of a world size its own part of the stream, so another world size reads other parts, and the Trainer's own
answer (``skip_first_batches``) counts batches of one rank. So each new rank rebuilds the pipelines of the old
ranks it takes over (their part of the stream, their batch size and DataLoader workers: a saved state loads only
into the loader that wrote it), loads their states, and reads their remainders example by example.

The rule, for N old ranks resumed on M new ones:

* M < N: new rank j takes the remainders of the old ranks r with r mod M = j, one example from each in turn
  (a remainder that ends drops out of the turn).
* M > N: the new ranks j with j mod N = r share old rank r's remainder: with k of them, the one at (j - r) / N
  takes its examples at (j - r) / N, + k, + 2k, ... Each reads the whole remainder and keeps its share.
* M = N: each rank takes its own, and the loader resumes as it was (bit-identical to an uninterrupted run).

What stays exact: every example of every old rank's remainder is trained once, masked as it would have been
(masks key on an example's content, train/data/stream.py ``content_index``). What changes: which rank sees it and
when, so the losses follow the uninterrupted run's, not equal them. The resumed rank's own loader reads nothing
until the remainders end; then the next pass over the stream is split among the new ranks as for a fresh run.
A checkpoint saved while remainders are read holds this tree of positions (``kind``: rank, interleave, stride), so
a run can be resumed on yet another number of ranks, and the tree redistributed again.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any, TypeGuard

from train.borrowed.datasets import stream_state_problem
from train.borrowed.torchdata import loader_state_problem

RANK, INTERLEAVE, STRIDE = "rank", "interleave", "stride"


def rank_position(
    loader_state: dict[str, Any], rank: int, world_size: int, batch_size: int | None, workers: int
) -> dict:
    """A rank's saved position: its loader's state and what rebuilds that loader (whose part of the stream, its
    batch size and workers); ``used``: examples of the loader's next batch already trained."""
    return {
        "kind": RANK, "rank": rank, "world_size": world_size, "batch_size": batch_size, "workers": workers,
        "loader": loader_state, "used": 0,
    }  # fmt: skip


def redistribute(saved: list[dict[str, Any]], rank: int, world_size: int) -> dict[str, Any]:
    """New rank ``rank`` of ``world_size``'s position from the ``saved`` positions of the old ranks (the rule above)."""
    old = len(saved)
    if old == world_size:
        return saved[rank]
    if world_size < old:
        parts = saved[rank::world_size]
        return parts[0] if len(parts) == 1 else {"kind": INTERLEAVE, "parts": parts, "turn": 0, "done": []}
    source = rank % old
    sharing = len(range(source, world_size, old))
    if sharing == 1:
        return saved[source]
    return {"kind": STRIDE, "part": saved[source], "every": sharing, "skip": (rank - source) // old}


def position_problem(position: Any, where: str = "position") -> str | None:
    """What makes a saved ``position`` unusable, naming the field (``ranks[1].parts[0].used: -1 ...``), or None.
    A checkpoint's stream_state.json is data its reader did not write: every field the rule above reads is
    checked for its type and its range, and a tree's parts against each other, before any loader is built; a
    rank's loader state field by field, as torchdata and datasets write it (train/borrowed/torchdata.py
    ``loader_state_problem`` says what bounds its counts: a stream's length is not known)."""
    if not isinstance(position, dict):
        return f"{where}: not a position (a mapping with a kind)"
    kind = position.get("kind")
    if kind == RANK:
        return _rank_problem(position, where)
    if kind == INTERLEAVE:
        parts = position.get("parts")
        if not isinstance(parts, list) or not parts:
            return f"{where}.parts: not a list of positions"
        found = [p for i, part in enumerate(parts) if (p := position_problem(part, f"{where}.parts[{i}]"))]
        done = position.get("done", [])
        if not isinstance(done, list) or not all(_whole(d, 0, len(parts) - 1) for d in done):
            return found[0] if found else f"{where}.done: not a list of part numbers below {len(parts)}"
        return found[0] if found else _range_problem(position, where, "turn", 0, len(parts) - 1)
    if kind == STRIDE:
        every = position.get("every")
        if not _whole(every, 1, None):
            return f"{where}.every: {every!r} is not a whole number of ranks, at least 1"
        return position_problem(position.get("part"), f"{where}.part") or _range_problem(
            position, where, "skip", 0, every - 1
        )
    return f"{where}.kind: {kind!r} is not one of {RANK}, {INTERLEAVE}, {STRIDE}"


def _rank_problem(position: dict[str, Any], where: str) -> str | None:
    for field, low in (("world_size", 1), ("batch_size", 1), ("workers", 0)):
        if problem := _range_problem(position, where, field, low, None):
            return problem
    workers, batch_size = position["workers"], position["batch_size"]
    loader = position.get("loader")
    return (
        loader_state_problem(loader, workers, batch_size, f"{where}.loader", stream_state_problem)
        or _range_problem(position, where, "rank", 0, position["world_size"] - 1)
        or _range_problem(position, where, "used", 0, batch_size)
    )


def _range_problem(position: dict[str, Any], where: str, field: str, low: int, high: int | None) -> str | None:
    value = position.get(field)
    if _whole(value, low, high):
        return None
    return f"{where}.{field}: {value!r} is not a whole number from {low}" + (f" to {high}" if high is not None else "")


def _whole(value: Any, low: int, high: int | None) -> TypeGuard[int]:
    in_range = isinstance(value, int) and not isinstance(value, bool) and value >= low
    return in_range and (high is None or value <= high)


def own_loader_state(position: dict[str, Any], rank: int, world_size: int, batch_size: int, workers: int) -> Any:
    """The loader state to load into this rank's own loader when ``position`` is exactly what it saved (same rank,
    world size, batch size and workers, at a batch boundary); None when the position must be rebuilt."""
    if position["kind"] != RANK or position["used"]:
        return None
    whose = (position["rank"], position["world_size"], position["batch_size"], position["workers"])
    return position["loader"] if whose == (rank, world_size, batch_size, workers) else None


class Examples:
    """An old pipeline's remainder, one example at a time, and its position."""

    def __next__(self) -> Any:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        return self

    def position(self) -> dict[str, Any]:
        raise NotImplementedError


# (rank, world size) -> that rank's part of the stream; (dataset, batch size, workers) -> a StatefulDataLoader
PartOf = Callable[[int, int], Any]
LoaderOf = Callable[[Any, int, int], Any]


def examples(position: dict[str, Any], part_of: PartOf, loader_of: LoaderOf) -> Examples:
    kind = position.get("kind")
    if kind == RANK:
        return _RankRemainder(position, part_of, loader_of)
    if kind == INTERLEAVE:
        return _Interleaved(position, part_of, loader_of)
    if kind == STRIDE:
        return _Strided(position, part_of, loader_of)
    raise ValueError(f"unknown stream position kind {kind!r}")


class _RankRemainder(Examples):
    """Old rank ``rank`` of ``world_size``'s loader rebuilt (collating nothing) and resumed where it stopped."""

    def __init__(self, position: dict[str, Any], part_of: PartOf, loader_of: LoaderOf) -> None:
        self.saved = dict(position)
        dataset = part_of(int(position["rank"]), int(position["world_size"]))
        self.loader = loader_of(dataset, int(position["batch_size"]), int(position["workers"]))
        self.loader.load_state_dict(position["loader"])
        self.before, self.used = position["loader"], int(position["used"])  # the batch in hand, from its start
        self.batch: list[Any] | None = None
        self.iterator: Iterator[Any] | None = None

    def __next__(self) -> Any:
        if self.iterator is None:
            self.iterator = iter(self.loader)
        while self.batch is None or self.used >= len(self.batch):
            if self.batch is None:  # the batch the saved position stands in: ``used`` of it were trained
                self.batch = next(self.iterator)
                continue
            before = self.loader.state_dict()
            self.batch = next(self.iterator)  # at the end: StopIteration, the position left as it was
            self.before, self.used = before, 0
        example = self.batch[self.used]
        self.used += 1
        return example

    def position(self) -> dict[str, Any]:
        return {**self.saved, "loader": self.before, "used": self.used}


class _Interleaved(Examples):
    def __init__(self, position: dict[str, Any], part_of: PartOf, loader_of: LoaderOf) -> None:
        self.parts = [examples(p, part_of, loader_of) for p in position["parts"]]
        self.turn, self.done = int(position["turn"]), set(position.get("done", []))

    def __next__(self) -> Any:
        for _ in range(len(self.parts)):
            index, self.turn = self.turn, (self.turn + 1) % len(self.parts)
            if index in self.done:
                continue
            try:
                return next(self.parts[index])
            except StopIteration:
                self.done.add(index)
        raise StopIteration

    def position(self) -> dict[str, Any]:
        parts = [p.position() for p in self.parts]
        return {"kind": INTERLEAVE, "parts": parts, "turn": self.turn, "done": sorted(self.done)}


class _Strided(Examples):
    def __init__(self, position: dict[str, Any], part_of: PartOf, loader_of: LoaderOf) -> None:
        self.part = examples(position["part"], part_of, loader_of)
        self.every, self.skip = int(position["every"]), int(position["skip"])

    def __next__(self) -> Any:
        while self.skip:
            next(self.part)
            self.skip -= 1
        example = next(self.part)
        self.skip = self.every - 1
        return example

    def position(self) -> dict[str, Any]:
        return {"kind": STRIDE, "part": self.part.position(), "every": self.every, "skip": self.skip}


class ResumedStream:
    """A rank's training batches after a resume on another number of ranks: the remainders its position names, in
    batches of this run's size, then (from the next pass) its own loader. No workers of its own and nothing read
    ahead, so ``state_dict`` is exactly what the Trainer has taken; the old pipelines' loaders keep their workers.
    ``num_workers`` is the own loader's, whose state a checkpoint saved after the remainders holds."""

    def __init__(
        self, position: dict[str, Any], part_of: PartOf, loader_of: LoaderOf, own: Any, batch_size: int,
        collate: Callable[[list[Any]], Any],
    ) -> None:  # fmt: skip
        self.remainder: Examples | None = examples(position, part_of, loader_of)
        self.own = own
        self.batch_size, self.collate = batch_size, collate

    @property
    def num_workers(self) -> int:
        return int(self.own.num_workers)

    def __iter__(self) -> Iterator[Any]:
        if self.remainder is None:
            return iter(self.own)
        return self._remainder_batches()

    def _remainder_batches(self) -> Iterator[Any]:
        assert self.remainder is not None
        while batch := list(itertools.islice(self.remainder, self.batch_size)):
            yield self.collate(batch)
        self.remainder = None  # this pass ends with the remainders, as the old ranks' streams would have

    def state_dict(self) -> dict[str, Any]:
        return self.remainder.position() if self.remainder is not None else self.own.state_dict()
