"""What we borrow from torchdata (torchdata 0.11, ``torchdata/stateful_dataloader/stateful_dataloader.py``): the
layout of a StatefulDataLoader's state. torchdata hands the state out as an opaque dict; the job saves it with each
checkpoint (train/data/stream.py ``StreamPosition``), checks a saved one before torchdata reads it, and mends the
one torchdata gives right after a resume. Nothing here imports torchdata: the state is plain keys and numbers.

The layout written down below is also the check the canaries run against a real loader's state (tests/borrowed/):
a torchdata that writes another layout fails them, and at run time a live state that does not fit is refused
before anything reads it (train/data/stream.py ``StreamLoader``), never mended or saved by guesswork."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from train.borrowed.touch import borrows

# torchdata 0.11's keys (stateful_dataloader.py: its module constants, _StatefulSingleProcessDataLoaderIter's and
# _StatefulMultiProcessingDataLoaderIter's class constants; worker.py and incremental_state.py for a worker's)
SNAPSHOT, MAIN_SNAPSHOT, WORKER_SNAPSHOTS = "_snapshot", "_main_snapshot", "_worker_snapshots"
SNAPSHOT_STEP, STEPS_SINCE_SNAPSHOT = "_snapshot_step", "_steps_since_snapshot"
LAST_YIELDED_WORKER_ID = "_last_yielded_worker_id"
NUM_YIELDED, SAMPLER_ITER_YIELDED, SAMPLER_ITER_STATE = "_num_yielded", "_sampler_iter_yielded", "_sampler_iter_state"
DATASET_STATE, ITERATOR_FINISHED = "dataset_state", "_iterator_finished"

# torch draws a DataLoader's base seed as a non-negative int64 (torch/utils/data/dataloader.py, _BaseDataLoaderIter)
_SEEDS = 2**63 - 1
# What a dataset's own state (datasets' layout, not torchdata's) is checked by, given where it is: a problem or None
DatasetProblem = Callable[[Any, str], str | None]


@dataclass(frozen=True)
class _Holds:
    """What one field of the layout holds: a whole number from 0, within ``low`` and ``high`` (None: no bound) and
    ``nullable`` (null as well), a flag, null, or a dataset's own state. ``why`` says where a bound comes from;
    ``agrees``: the bound is another field's count, which says the same thing (``why`` names it)."""

    kind: str
    low: int = 0
    high: int | None = None
    why: str = ""
    nullable: bool = False
    agrees: bool = False

    def problem(self, value: Any, where: str) -> str | None:
        if value is None and (self.nullable or self.kind == "null"):
            return None
        if self.kind == "flag":
            return None if isinstance(value, bool) else f"{where}: {value!r} is not true or false"
        if self.kind == "null":
            return f"{where}: {value!r} is not null, as torchdata 0.11 writes it for a datasets stream"
        if self.kind == "dataset":
            return None if isinstance(value, dict) else f"{where}: not a dataset's state (a mapping)"
        if _whole(value) is None:
            return f"{where}: {value!r} is not a whole number from 0"
        if self.low <= value and (self.high is None or value <= self.high):
            return None
        if self.agrees:
            return f"{where}: {value} disagrees with {self.why}"
        if self.low == self.high:
            return f"{where}: {value} is not {self.low} ({self.why})"
        return f"{where}: {value} is not a whole number from {self.low} to {self.high} ({self.why})"


_FLAG, _NULL, _DATASET, _COUNT = _Holds("flag"), _Holds("null"), _Holds("dataset"), _Holds("whole")
_OPTIONAL, _SEED = _Holds("whole", nullable=True), _Holds("whole", high=_SEEDS, why="a seed torch draws")
_OPTIONAL_SEED = _Holds("whole", high=_SEEDS, why="a seed torch draws", nullable=True)


def _whole(value: Any) -> int | None:
    """``value`` when it is a whole number from 0 (an int, not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _agreeing(value: int | None, extra: int, why: str) -> _Holds:
    """A count that must be ``value`` (or up to ``extra`` more), as another field of the state says (``why``); any
    count when that field is wrong itself (checked, and reported, first)."""
    return _COUNT if value is None else _Holds("whole", value, value + extra, why, agrees=True)


def _sampler(yielded: int | None, batch_size: int) -> dict[str, Any]:
    """The batch sampler's iterator over a stream (torchdata 0.11 ``sampler.py`` ``_BatchSamplerIterator``): it
    counts the indices it handed out, ``batch_size`` per batch, and keeps no more for an infinite sampler."""
    samples = None if yielded is None else yielded * batch_size
    why = f"{SAMPLER_ITER_YIELDED}, {yielded} batches of {batch_size}"
    return {"samples_yielded": _agreeing(samples, 0, why)}


def _layout(state: Mapping[str, Any], workers: int, batch_size: int) -> dict[str, Any]:
    """torchdata 0.11's state of a loader with ``workers`` and ``batch_size`` over a datasets stream, each key with
    what it holds, in the order checked: a count before the counts that must agree with it (what those bounds read
    of ``state`` is used only when it is right itself; a wrong one is reported first)."""
    if not workers:  # _StatefulSingleProcessDataLoaderIter.state_dict
        done, asked = _whole(state.get(NUM_YIELDED)), _whole(state.get(SAMPLER_ITER_YIELDED))
        # the sampler is one batch ahead of the batches yielded once it has asked for the one a pass ends on
        said = f"{NUM_YIELDED}, {done} (the batches yielded; the sampler asks for one more to end a pass)"
        return {
            NUM_YIELDED: _COUNT, SAMPLER_ITER_YIELDED: _agreeing(done, 1, said),
            SAMPLER_ITER_STATE: _sampler(asked, batch_size), "_index_sampler_state": _NULL,
            "_IterableDataset_len_called": _OPTIONAL, "_shared_seed": _OPTIONAL_SEED,
            "fetcher_state": {"dataset_iter_state": _NULL, "fetcher_ended": _FLAG}, DATASET_STATE: _DATASET,
            ITERATOR_FINISHED: _FLAG,
        }  # fmt: skip
    snapshot = state[SNAPSHOT] if isinstance(state.get(SNAPSHOT), dict) else {}
    step = _whole(snapshot.get(SNAPSHOT_STEP))
    worker = {"dataset_iter_state": _NULL, "fetcher_ended": _FLAG}
    # a snapshot per worker, asked of no more than one past those saved: a count of a billion workers is found
    # wrong by the first one missing, not after a billion are written down
    saved = snapshot.get(WORKER_SNAPSHOTS)
    asked = min(workers, len(saved) + 1 if isinstance(saved, dict) else 1)
    return {  # _StatefulMultiProcessingDataLoaderIter.state_dict: the last snapshot, and the steps since
        SNAPSHOT: {
            SNAPSHOT_STEP: _COUNT,
            LAST_YIELDED_WORKER_ID: _Holds("whole", 0, workers - 1, f"one of the {workers} workers"),
            MAIN_SNAPSHOT: {
                "_num_workers": _agreeing(workers, 0, f"the position's workers, {workers}"),
                SAMPLER_ITER_YIELDED: _agreeing(step, 0, f"{SNAPSHOT}.{SNAPSHOT_STEP}, {step} (the batches yielded)"),
                SAMPLER_ITER_STATE: _sampler(step, batch_size), "_index_sampler_state": _NULL,
                "_IterableDataset_len_called": _OPTIONAL, "_shared_seed": _OPTIONAL_SEED,
                "_base_seed": _SEED,
            },
            WORKER_SNAPSHOTS: {
                f"worker_{i}": {
                    "worker_id": _agreeing(i, 0, f"its key, worker_{i}"), DATASET_STATE: _DATASET,
                    "fetcher_state": worker,
                }
                for i in range(asked)
            },
        },
        # the batches torchdata reads on from the snapshot when the state is loaded: none, since our loaders
        # snapshot at every step (snapshot_every_n_steps, torchdata's default 1); more would run past the snapshot
        STEPS_SINCE_SNAPSHOT: _Holds("whole", 0, 0, "our loaders snapshot at every step"),
        ITERATOR_FINISHED: _FLAG,
    }  # fmt: skip


def _problem(value: Any, layout: Any, where: str, dataset_problem: DatasetProblem | None) -> str | None:
    if isinstance(layout, dict):
        if not isinstance(value, dict):
            return f"{where}: not a mapping of {', '.join(layout)}"
        for key, holds in layout.items():
            if key not in value:
                return f"{where}.{key}: missing (torchdata 0.11 writes it)"
            if problem := _problem(value[key], holds, f"{where}.{key}", dataset_problem):
                return problem
        unknown = next((key for key in value if key not in layout), None)
        return None if unknown is None else f"{where}.{unknown}: not a field torchdata 0.11 writes"
    if problem := layout.problem(value, where):
        return problem
    return dataset_problem(value, where) if layout is _DATASET and dataset_problem else None


@borrows("torchdata", "0.11", "stateful_dataloader/stateful_dataloader.py StatefulDataLoader.state_dict (layout)")
def loader_state_problem(
    state: Any, workers: int, batch_size: int, where: str = "loader", dataset_problem: DatasetProblem | None = None
) -> str | None:
    """What in ``state`` is not a StatefulDataLoader's state as torchdata 0.11 writes it for a loader with
    ``workers`` and ``batch_size`` over a datasets stream, naming the field (``loader._snapshot._snapshot_step: -1
    is not a whole number from 0``), or None. torchdata 0.11's ``stateful_dataloader.py`` writes the state of
    ``_StatefulSingleProcessDataLoaderIter`` (no workers) or of ``_StatefulMultiProcessingDataLoaderIter`` (a
    snapshot of the main process and of each worker), all private keys, and reads them back without a check: a
    wrong type crashes it, a count of batches to read on runs off the stream's end. No public API describes them.

    Every key, none missing, none added; every count and index a whole number from 0 (an int, not a bool). What
    bounds them from above, past the end: a stream's length is unknown until it is read to its end, nothing in the
    checkpoint says what the stream holds, and the checkpoint's step is no bound either (the batches of a step
    change when a run resumes with another global batch, and an old rank's loader is read by several new ranks
    when it resumes on more). So a count is past the end where the state itself bounds it. It counts a pass's
    batches several times over, and those counts must agree: the sampler's batches (``_sampler_iter_yielded``)
    are the batches yielded (``_num_yielded``, or one more once the pass has ended; ``_snapshot_step`` with
    workers) and its indices (``samples_yielded``) that many batches of ``batch_size``; a count beyond the others
    claims batches never yielded. A worker id is below ``workers``; the batches to read on past the snapshot are
    none (our loaders snapshot every step). Counts raised all together move nothing: where a stream resumes is its
    dataset's state, checked by ``dataset_problem(state, where)`` (datasets' layout: train/borrowed/datasets.py),
    and torchdata fast-forwards by its counts only a dataset with no state of its own, which ours never are."""
    if not isinstance(state, dict):
        return f"{where}: not a data loader's state (a mapping)"
    return _problem(state, _layout(state, workers, batch_size), where, dataset_problem)


@borrows("torchdata", "0.11", "stateful_dataloader/stateful_dataloader.py _StatefulMultiProcessingDataLoaderIter")
def workers_as_loaded(state: dict[str, Any], loaded: dict[str, Any], workers: int) -> dict[str, Any] | None:
    """``state``, the state of a loader with ``workers`` that was given ``loaded`` (both of the layout
    :func:`loader_state_problem` checks), with the loaded snapshot of each worker that has not yielded a batch since;
    None once every worker has, when ``state`` is right as it is. torchdata 0.11 (``stateful_dataloader.py``,
    ``_StatefulMultiProcessingDataLoaderIter``: a worker's snapshot is its ``_AckStartup`` state until its first
    batch arrives) gives such a worker's fresh start, not the position loaded, so a checkpoint saved then would read
    its examples a second time. Workers yield in turn after the last one the loaded state names. A state loaded at
    its pass's end (``_iterator_finished``) has nothing to mend: torchdata starts the next pass afresh. torchdata
    has no public way to mend it, nor a fix upstream in 0.11."""
    if loaded[ITERATOR_FINISHED]:
        return None
    now, was = state[SNAPSHOT], loaded[SNAPSHOT]
    since = now[MAIN_SNAPSHOT][SAMPLER_ITER_YIELDED] - was[MAIN_SNAPSHOT][SAMPLER_ITER_YIELDED]
    if since >= workers:
        return None
    mended = copy.deepcopy(state)
    yielded = {(was[LAST_YIELDED_WORKER_ID] + 1 + i) % workers for i in range(since)}
    for worker in set(range(workers)) - yielded:
        name = f"worker_{worker}"
        mended[SNAPSHOT][WORKER_SNAPSHOTS][name] = copy.deepcopy(was[WORKER_SNAPSHOTS][name])
    return mended
