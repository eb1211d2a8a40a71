"""What we borrow from datasets (datasets 5.2, ``datasets/arrow_dataset.py``, ``datasets/config.py``,
``datasets/iterable_dataset.py``): a dataset's fingerprint, the offline flag lifted for object stores, and the layout
of a stream's state. Nothing here imports datasets until it is used."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from train.borrowed.touch import borrows


@borrows("datasets", "5.2", "arrow_dataset.py Dataset._fingerprint")
def fingerprint(dataset: Any) -> str:
    """``dataset``'s fingerprint: the hash datasets keeps of its content and the transforms that made it (datasets
    5.2, ``arrow_dataset.py``, ``Dataset._fingerprint``, what ``map``/``filter`` name their cache files by). Our
    tokenization and filter caches are keyed by it, so a changed corpus is never read from an old cache. datasets
    has no public accessor for it."""
    return dataset._fingerprint


@borrows("datasets", "5.2", "config.py HF_HUB_OFFLINE, utils/file_utils.py _raise_if_offline_mode_is_enabled")
@contextlib.contextmanager
def hub_offline_lifted() -> Iterator[None]:
    """Inside this block datasets does not refuse remote URLs for offline mode (datasets 5.2: ``config.py``'s
    ``HF_HUB_OFFLINE``, read at each request by ``utils/file_utils.py`` ``_raise_if_offline_mode_is_enabled``,
    "Offline mode is enabled. Tried to reach s3://..."), though its streaming path reads the same files. A patch of
    the module's flag, restored after: offline mode in datasets covers every remote URL, with no public switch for
    the hub alone."""
    import datasets.config  # the library's own import cost, paid only when used

    was = datasets.config.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = False
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE = was


@borrows("datasets", "5.2", "iterable_dataset.py IterableDataset.state_dict, _BaseExamplesIterable.load_state_dict")
def stream_state_problem(state: Any, where: str) -> str | None:
    """What in ``state``, a datasets stream's state as a data loader saved it, is not as datasets 5.2 writes it for
    the streams we build, naming the field, or None. datasets 5.2 (``iterable_dataset.py``) documents the state
    only as a dict: ``IterableDataset.state_dict`` is ``{"examples_iterable": ..., "epoch": n}``, each examples
    iterable's state its counts and indices (``shard_idx``, ``shard_example_idx``, ``batch_idx``...), the states of
    the iterables it wraps and its class name (``type``). ``_BaseExamplesIterable.load_state_dict`` merges it into
    a fresh state unchecked: a string where a count was crashes the stream's first read.

    Mappings and lists of null, whole numbers from 0 (counts and indices; not a bool, not a float) and, as the
    value of ``type``, strings. Their upper bounds (a shard's length, a chunk's) are nowhere in the checkpoint:
    where a stream resumes within its files, only reading them can check."""
    if isinstance(state, dict):
        for key, value in state.items():
            if key == "type" and not isinstance(value, str):
                return f"{where}.type: {value!r} is not the name of a datasets examples iterable"
            if key != "type" and (problem := stream_state_problem(value, f"{where}.{key}")):
                return problem
        return None
    if isinstance(state, list):
        return next((p for i, value in enumerate(state) if (p := stream_state_problem(value, f"{where}[{i}]"))), None)
    if state is None or (isinstance(state, int) and not isinstance(state, bool) and state >= 0):
        return None
    return f"{where}: {state!r} is not a whole number from 0 (a datasets stream's count or index)"
