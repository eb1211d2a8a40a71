"""train/run/job.py's resume agreement: world rank 0 alone chooses the checkpoint (and sets damaged ones aside),
every rank resumes from its answer, in a real two-process gloo group."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from tests.helpers import checkpoint, truncate
from train.config import load_config
from train.outputs.base import OutputLocation
from train.outputs.location import output_location
from train.outputs.runfiles import RunFiles
from train.run.job import agreed_resume


def location_of(output_dir: Path) -> OutputLocation:
    return output_location(load_config([], {"MLM_OUTPUT_DIR": str(output_dir)}))


def test_one_process_chooses_the_newest_whole_checkpoint_and_sets_the_damaged_one_aside(tmp_path: Path) -> None:
    checkpoint(tmp_path, 10)
    truncate(checkpoint(tmp_path, 20) / "model.safetensors")
    assert agreed_resume(location_of(tmp_path)) == str(tmp_path / "checkpoint-10")
    assert [path.name for path in RunFiles(tmp_path).checkpoints()] == ["checkpoint-10"]
    assert len(RunFiles(tmp_path).asides()) == 1  # kept for a post-mortem, out of the Trainer's way


def rank_main(rank: int, output_dir: str, port: int, answers: str) -> None:
    """One rank: rank 1's own choice would be another checkpoint, so the answer shows whose choice it took."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        location = location_of(Path(output_dir))
        if rank == 1:
            location.choose_resume = lambda warn: "rank 1 chose for itself"  # type: ignore[method-assign]
        resume = agreed_resume(location)
        Path(answers, f"rank-{rank}.json").write_text(json.dumps(resume))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_every_rank_resumes_from_world_rank_0s_choice(tmp_path: Path) -> None:
    output_dir, answers = tmp_path / "out", tmp_path / "answers"
    answers.mkdir()
    checkpoint(output_dir, 10)
    truncate(checkpoint(output_dir, 20) / "optimizer.pt")
    mp.spawn(rank_main, args=(str(output_dir), free_port(), str(answers)), nprocs=2, join=True)
    chosen = {path.name: json.loads(path.read_text()) for path in answers.iterdir()}
    assert chosen == {
        "rank-0.json": str(output_dir / "checkpoint-10"),
        "rank-1.json": str(output_dir / "checkpoint-10"),
    }
    assert len(RunFiles(output_dir).asides()) == 1  # set aside once, by rank 0
