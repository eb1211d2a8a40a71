"""Loading a DCP checkpoint without unpickling anything that could run code (torch 2.15): a checkpoint the run
reads is data (train/common/untrusted.py); torch has no safe reader (pytorch#189308, open).

dcp.load reads two things through pickle besides the tensors (which FileSystemReader.read_data already loads with
torch.load(weights_only=True), filesystem.py:899-903):
  * the ``.metadata`` file: FileSystemReader.read_metadata -> plain ``pickle.load`` (filesystem.py:926-930);
  * every non-tensor value (BYTE_IO items, e.g. the optimizer's param_groups: lr, betas, eps...):
    DefaultLoadPlanner.load_bytes -> ``torch.load(value, weights_only=False)`` (default_planner.py:382-392).
Both are replaced here by torch.load(weights_only=True) (torch's restricted unpickler), with an allowlist of DCP's
own metadata classes for the first. That unpickler implements pickle protocol <= 2 only (no FRAME opcode), and the
stock .metadata is written at Python's default protocol: so the writer also stores the Metadata with torch.save.
Nothing in this file imports pickle.
"""

from __future__ import annotations

import io
import os
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.storage import WriteResult
from torch.serialization import safe_globals

from train.borrowed.torch_distributed import metadata_private_classes, set_element

# What a .metadata written by torch 2.15's FileSystemWriter holds (listed from the files it wrote).
METADATA_CLASSES = [
    Metadata, MetadataIndex, StorageMeta, TensorProperties, TensorStorageMetadata, ChunkStorageMetadata,
    BytesStorageMetadata, *metadata_private_classes(),
]  # fmt: skip


SAFE_METADATA = ".metadata.pt"  # the same Metadata object, written by torch.save (zip, pickle protocol 2)


class SafeFileSystemWriter(FileSystemWriter):
    """FileSystemWriter that also writes the checkpoint's Metadata with torch.save, which torch.load(weights_only=True)
    can read back. (The stock ``.metadata`` is a pickle at the default protocol 4/5, whose FRAME opcode torch's
    restricted unpickler does not implement: it cannot read that file at all.) finish() runs on the coordinator."""

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        super().finish(metadata, results)  # fills metadata.storage_data / storage_meta, writes .metadata
        if metadata.storage_meta is not None and metadata.storage_meta.checkpoint_id is not None:
            # a pathlib.Path here would need PosixPath allowlisted: keep the allowlist to DCP's own classes
            metadata.storage_meta.checkpoint_id = os.fspath(metadata.storage_meta.checkpoint_id)
        tmp = self.fs.concat_path(self.path, SAFE_METADATA + ".tmp")
        with self.fs.create_stream(tmp, "wb") as file:
            torch.save(metadata, file)
        self.fs.rename(tmp, self.fs.concat_path(self.path, SAFE_METADATA))


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader that reads the Metadata from SAFE_METADATA through torch.load(weights_only=True) with DCP's
    metadata classes allowlisted, and never opens the pickled ``.metadata``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise FileNotFoundError("rank-local metadata is not read by SafeFileSystemReader")
        path = self.fs.concat_path(self.path, SAFE_METADATA)
        with self.fs.create_stream(path, "rb") as file, safe_globals(METADATA_CLASSES):
            metadata = torch.load(file, weights_only=True)
        if not isinstance(metadata, Metadata):
            raise ValueError(f"{path}: not a DCP metadata file ({type(metadata).__name__})")
        if getattr(metadata, "storage_meta", None) is None:  # as FileSystemReader.read_metadata does
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner whose non-tensor values (the optimizer's param_groups) load with weights_only=True."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
