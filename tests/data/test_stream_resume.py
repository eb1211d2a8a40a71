"""The rule that redistributes a stream's saved positions to another number of ranks (train/data/stream_resume.py),
on real StatefulDataLoaders over a datasets stream split by split_dataset_by_node: every example of every old
rank's remainder is read exactly once by the new ranks, however many there are, with or without DataLoader workers,
and a position saved mid-remainder (a tree of positions) resumes on yet another number of ranks."""

from __future__ import annotations

import itertools
from typing import Any

import datasets
import pytest
from datasets.distributed import split_dataset_by_node

from train.data.stream import StreamLoader
from train.data.stream_resume import (
    ResumedStream,
    own_loader_state,
    position_problem,
    rank_position,
    redistribute,
)

EXAMPLES = 96
STREAM = datasets.Dataset.from_dict({"n": list(range(EXAMPLES))}).to_iterable_dataset(num_shards=4)


def part_of(rank: int, world_size: int) -> Any:
    return split_dataset_by_node(STREAM, rank=rank, world_size=world_size)


def loader_of(dataset: Any, batch_size: int, workers: int) -> StreamLoader:
    return StreamLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=list)


def numbers(batch: list[dict[str, int]]) -> list[int]:
    return [example["n"] for example in batch]


def first_run(world_size: int, batch_size: int, workers: int, steps: int) -> tuple[list[int], list[dict]]:
    """Each rank of a first run trains ``steps`` batches; what they read and the positions they save."""
    read, saved = [], []
    for rank in range(world_size):
        loader = loader_of(part_of(rank, world_size), batch_size, workers)
        for batch in itertools.islice(loader, steps):
            read += numbers(batch)
        saved.append(rank_position(loader.state_dict(), rank, world_size, batch_size, workers))
    return read, saved


def resumed(saved: list[dict], world_size: int, batch_size: int, steps: int | None) -> tuple[list[int], list[dict]]:
    """Each rank of a resumed run reads ``steps`` batches of its remainder (None: all of it); the positions it
    would save then."""
    read, positions = [], []
    for rank in range(world_size):
        own = loader_of(part_of(rank, world_size), batch_size, 0)
        stream = ResumedStream(redistribute(saved, rank, world_size), part_of, loader_of, own, batch_size, numbers)
        for batch in itertools.islice(iter(stream), steps):
            read += batch
        positions.append(stream.state_dict() if steps is not None else None)
    return read, positions


@pytest.mark.parametrize(("old", "new", "workers"), [(2, 1, 0), (1, 2, 0), (2, 3, 2), (3, 2, 2), (4, 2, 0)])
def test_every_remaining_example_is_read_once(old: int, new: int, workers: int) -> None:
    before, saved = first_run(old, batch_size=5, workers=workers, steps=3)
    after, _ = resumed(saved, new, batch_size=4, steps=None)
    assert len(before) == old * 15
    assert sorted(before + after) == list(range(EXAMPLES))


def test_a_position_saved_mid_remainder_resumes_on_yet_another_number_of_ranks() -> None:
    before, saved = first_run(2, batch_size=5, workers=2, steps=2)
    middle, tree = resumed(saved, 3, batch_size=3, steps=2)  # stops mid-batch of the old loaders
    assert {p["kind"] for p in tree} == {"rank", "stride"}
    after, _ = resumed(tree, 1, batch_size=7, steps=None)
    assert sorted(before + middle + after) == list(range(EXAMPLES))


def test_fewer_ranks_take_the_old_ranks_in_turn() -> None:
    _, saved = first_run(2, batch_size=4, workers=0, steps=1)
    read, _ = resumed(saved, 1, batch_size=4, steps=1)
    own = [list(part_of(r, 2))[4:6] for r in range(2)]
    assert read == [own[0][0]["n"], own[1][0]["n"], own[0][1]["n"], own[1][1]["n"]]


def test_the_same_ranks_resume_their_own_loaders() -> None:
    _, saved = first_run(2, batch_size=4, workers=0, steps=1)
    assert redistribute(saved, 1, 2) is saved[1]
    assert own_loader_state(saved[1], 1, 2, 4, 0) == saved[1]["loader"]
    assert own_loader_state(saved[1], 1, 2, 8, 0) is None  # another batch size: rebuilt, not loaded
    assert own_loader_state(saved[0], 1, 2, 4, 0) is None


def test_a_loader_saved_one_batch_after_a_resume_reads_on_where_it_stopped() -> None:
    """torchdata 0.11 gives a worker that has not yielded since the load its fresh start (StreamLoader mends it)."""
    expected = [numbers(b) for b in loader_of(part_of(1, 2), 5, 2)]
    first = loader_of(part_of(1, 2), 5, 2)
    batches = iter(first)
    next(batches), next(batches)
    resumed_once = loader_of(part_of(1, 2), 5, 2)
    resumed_once.load_state_dict(first.state_dict())
    assert numbers(next(iter(resumed_once))) == expected[2]
    resumed_twice = loader_of(part_of(1, 2), 5, 2)
    resumed_twice.load_state_dict(resumed_once.state_dict())
    assert numbers(next(iter(resumed_twice))) == expected[3]


@pytest.mark.parametrize("before_the_end", [1, 0])
def test_a_loader_resumed_at_its_pass_end_saves_the_next_pass_where_it_stands(before_the_end: int) -> None:
    """Resumed fewer batches before its pass's end than it has workers, or at the end: the next pass's position is
    its own, not the workers' loaded for the pass before (which would resume at that pass's end)."""
    whole = [numbers(b) for b in loader_of(part_of(0, 1), 16, 2)]
    first = loader_of(part_of(0, 1), 16, 2)
    batches = iter(first)
    for _ in range(len(whole) - before_the_end):
        next(batches)
    if not before_the_end:
        assert next(batches, None) is None  # the pass has ended
    resumed = loader_of(part_of(0, 1), 16, 2)
    resumed.load_state_dict(first.state_dict())
    if before_the_end:  # the rest of its pass; resumed at the end, torchdata starts the next pass at once
        assert [numbers(b) for b in resumed] == whole[-before_the_end:]
    next_pass = iter(resumed)
    assert [numbers(next(next_pass)) for _ in range(3)] == whole[:3]
    again = loader_of(part_of(0, 1), 16, 2)
    again.load_state_dict(resumed.state_dict())
    assert numbers(next(iter(again))) == whole[3]


def test_after_the_remainders_the_next_pass_is_the_ranks_own() -> None:
    _, saved = first_run(2, batch_size=5, workers=0, steps=3)
    own = loader_of(part_of(0, 1), 4, 2)
    stream = ResumedStream(redistribute(saved, 0, 1), part_of, loader_of, own, 4, numbers)
    remainder = [n for batch in stream for n in batch]
    assert len(remainder) == EXAMPLES - 30
    assert stream.num_workers == 2 and "kind" not in stream.state_dict()  # its own loader's state, and workers
    assert sorted(n for batch in stream for n in numbers(batch)) == list(range(EXAMPLES))  # a whole pass


def test_every_saved_position_a_resume_reads_is_in_range_and_a_wrong_one_is_named() -> None:
    _, saved = first_run(3, batch_size=4, workers=2, steps=2)
    _, trees = resumed(saved, 2, batch_size=4, steps=1)  # interleave and stride trees, as a checkpoint holds them
    for position in [*saved, *trees, *(redistribute(saved, r, 5) for r in range(5))]:
        assert position_problem(position) is None, position
    rank = saved[1]
    wrong = {
        "ranks[0].used: -1 is not a whole number from 0 to 4": {**rank, "used": -1},
        "ranks[0].used: 5 is not a whole number from 0 to 4": {**rank, "used": 5},
        "ranks[0].rank: 3 is not a whole number from 0 to 2": {**rank, "rank": 3},
        "ranks[0].batch_size: '4' is not a whole number from 1": {**rank, "batch_size": "4"},
        "ranks[0].workers: True is not a whole number from 0": {**rank, "workers": True},
        "ranks[0].loader: not a data loader's state": {**rank, "loader": [1]},
        "ranks[0].loader._snapshot._snapshot_step: -2 is not a whole number from 0": {
            **rank, "loader": {**rank["loader"], "_snapshot": {**rank["loader"]["_snapshot"], "_snapshot_step": -2}}
        },
        "ranks[0].kind: 'other' is not one of": {**rank, "kind": "other"},
        "ranks[0].parts: not a list of positions": {"kind": "interleave", "parts": [], "turn": 0},
        "ranks[0].turn: 2 is not a whole number from 0 to 1": {"kind": "interleave", "parts": [rank, rank], "turn": 2},
        "ranks[0].done: not a list of part numbers below 2": {
            "kind": "interleave", "parts": [rank, rank], "turn": 0, "done": [7]
        },
        "ranks[0].parts[1].used: None": {"kind": "interleave", "parts": [rank, {**rank, "used": None}], "turn": 0},
        "ranks[0].skip: 2 is not a whole number from 0 to 1": {"kind": "stride", "part": rank, "every": 2, "skip": 2},
        "ranks[0].every: 0 is not a whole number of ranks": {"kind": "stride", "part": rank, "every": 0, "skip": 0},
        "ranks[0].part: not a position": {"kind": "stride", "part": None, "every": 2, "skip": 0},
    }  # fmt: skip
    for said, position in wrong.items():
        problem = position_problem(position, "ranks[0]")
        assert problem is not None and problem.startswith(said), (said, problem)
