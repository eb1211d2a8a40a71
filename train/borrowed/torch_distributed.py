"""What we borrow from torch.distributed (torch 2.15): the private pieces of torch.distributed.checkpoint that
loading a checkpoint without unpickling needs (train/common/safe_dcp.py).

Private names are looked up when a function runs, not at import: a library that drops one fails that touch (and its
canary), not every import of this module."""

from __future__ import annotations

from typing import Any

from torch.distributed.checkpoint import filesystem as dcp_filesystem
from torch.distributed.checkpoint import metadata as dcp_metadata

from train.borrowed.touch import borrows


@borrows("torch", "2.15", "distributed/checkpoint/_traverse.py set_element")
def set_element(root: dict[str, Any], path: Any, value: Any) -> None:
    """Set ``value`` in the nested state dict ``root`` along ``path`` (torch 2.15,
    ``torch/distributed/checkpoint/_traverse.py``, ``set_element``, which ``DefaultLoadPlanner.load_bytes`` in
    ``default_planner.py`` uses for a flattened state dict). Our planner replaces ``load_bytes`` to read without
    unpickling and must place the value as the original does; the helper is not public."""
    from torch.distributed.checkpoint import _traverse  # a private module: resolved when used (see above)

    _traverse.set_element(root, path, value)


@borrows("torch", "2.15", "distributed/checkpoint/filesystem.py _StorageInfo, metadata.py _MEM_FORMAT_ENCODING")
def metadata_private_classes() -> list[type]:
    """The private classes a DCP ``Metadata`` written by torch 2.15's ``FileSystemWriter`` holds besides the public
    ones (``torch/distributed/checkpoint/filesystem.py`` ``_StorageInfo``, ``metadata.py`` ``_MEM_FORMAT_ENCODING``):
    ``torch.load(weights_only=True)`` must be allowed to build them to read it back. torch publishes no list of the
    classes a checkpoint's metadata may hold."""
    return [dcp_filesystem._StorageInfo, dcp_metadata._MEM_FORMAT_ENCODING]
