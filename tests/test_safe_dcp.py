"""The pickle-free reader of a sharded (torch.distributed.checkpoint) optimizer state: it loads what the writer
wrote, non-tensor values included, and refuses a metadata file that would run code when unpickled."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from tests.helpers import Payload
from train.common.safe_dcp import SAFE_METADATA, SafeFileSystemReader, SafeFileSystemWriter, SafeLoadPlanner


def test_reads_back_what_it_wrote(tmp_path: Path) -> None:
    dcp.save({"moment": torch.arange(6.0), "groups": [{"lr": 0.1}]}, storage_writer=SafeFileSystemWriter(tmp_path))
    state = {"moment": torch.zeros(6), "groups": [{"lr": 0.0}]}
    dcp.load(state, storage_reader=SafeFileSystemReader(tmp_path), planner=SafeLoadPlanner())
    assert torch.equal(state["moment"], torch.arange(6.0)) and state["groups"] == [{"lr": 0.1}]


def test_a_planted_metadata_file_is_refused_not_run(tmp_path: Path) -> None:
    dcp.save({"moment": torch.arange(6.0)}, storage_writer=SafeFileSystemWriter(tmp_path))
    payload = Payload(tmp_path / "ran")
    torch.save(payload, tmp_path / SAFE_METADATA)
    with pytest.raises(CheckpointException) as refused:
        dcp.load({"moment": torch.zeros(6)}, storage_reader=SafeFileSystemReader(tmp_path), planner=SafeLoadPlanner())
    assert "Weights only load failed" in repr(refused.value.failures)
    assert not payload.marker.exists()
