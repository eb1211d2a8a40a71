"""What we borrow from datasets (datasets 5.2, ``datasets/arrow_dataset.py``, ``datasets/config.py``): a dataset's
fingerprint, and the offline flag lifted for object stores. Nothing here imports datasets until it is used."""

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
