"""A branch's seeding (train/outputs/branch.py): the parent checkpoint verified and copied in, branch.json read
back as data, and what a branch's output_dir refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import train.launch.__main__ as launcher
from tests.helpers import checkpoint, flip
from train.common.errors import ConfigError
from train.outputs.branch import BranchPoint, is_branch_point, seed
from train.outputs.checkpoints import problem
from train.outputs.marker import mark_complete
from train.outputs.runfiles import OPTIONS_NAME, RunFiles


@pytest.fixture
def parent(tmp_path: Path) -> Path:
    point = checkpoint(tmp_path / "parent", 20, marked=False)
    (point / OPTIONS_NAME).write_text(json.dumps({"learning_rate": 1e-3, "world_size": 1}))
    mark_complete(point)
    return point


def test_a_checkpoint_is_copied_in_intact_and_its_record_read_back(parent: Path, tmp_path: Path) -> None:
    files = RunFiles(tmp_path / "branch")
    files.root.mkdir()
    branch, resumed = seed(files, str(parent))
    assert not resumed and branch.step == 20 and branch.checkpoint == "checkpoint-20"
    assert problem(files.checkpoint(20)) is None  # whole and as its list says, in the branch's directory
    assert (parent / "trainer_state.json").exists()  # the parent's is untouched
    assert not list(files.root.glob(".branch-*"))  # no scratch left
    read = BranchPoint.read(files)
    assert read == branch and read.learning_rate == 1e-3
    assert is_branch_point(BranchPoint.read(files), str(files.checkpoint(20))) == branch
    assert is_branch_point(BranchPoint.read(files), str(files.checkpoint(30))) is None
    again, resumed = seed(files, str(parent))  # run again: the branch resumes, nothing is copied
    assert resumed and again == branch


def test_a_damaged_checkpoint_is_refused_and_nothing_is_written(parent: Path, tmp_path: Path) -> None:
    flip(parent / "model.safetensors")
    files = RunFiles(tmp_path / "branch")
    files.root.mkdir()
    with pytest.raises(ConfigError, match="cannot be branched from: model.safetensors"):
        seed(files, str(parent))
    assert sorted(p.name for p in files.root.iterdir()) == []


@pytest.mark.parametrize("kind", ["not a checkpoint", "other run", "other branch"])
def test_what_a_branch_refuses(parent: Path, tmp_path: Path, kind: str) -> None:
    files = RunFiles(tmp_path / "branch")
    files.root.mkdir()
    source = str(parent)
    if kind == "not a checkpoint":
        source = str(parent.parent)
        expected = "not a checkpoint"
    elif kind == "other run":
        files.run_json.write_text("{}")
        expected = "holds a run already"
    else:
        seed(files, str(parent))
        source = str(checkpoint(tmp_path / "other", 10))
        expected = "is a branch of"
    with pytest.raises(ConfigError, match=expected):
        seed(files, source)


@pytest.mark.parametrize(
    "record, field",
    [
        ({"step": "20"}, "step"),
        ({"checkpoint": "../checkpoint-20"}, "checkpoint"),
        ({"checkpoint": "checkpoint-21"}, "checkpoint"),
        ({"parent_options": []}, "parent_options"),
    ],
)
def test_a_branch_record_is_data_checked_field_by_field(parent: Path, tmp_path: Path, record: dict, field: str) -> None:
    files = RunFiles(tmp_path / "branch")
    files.root.mkdir()
    seed(files, str(parent))
    data = json.loads(files.branch.read_text())
    files.branch.write_text(json.dumps({**data, **record}))
    with pytest.raises(ConfigError, match=f"field '{field}'"):
        BranchPoint.read(files)


def test_a_linked_branch_record_is_refused(tmp_path: Path) -> None:
    files = RunFiles(tmp_path / "branch")
    files.root.mkdir()
    (tmp_path / "elsewhere.json").write_text("{}")
    files.branch.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(ConfigError, match="not a regular file"):
        BranchPoint.read(files)


def test_a_branch_refuses_a_phase_plan(tmp_path: Path) -> None:
    """A branch trains one set of options: a preset with phases is refused before anything is copied."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("phases:\n  - {steps: 4}\n")
    env = {"MLM_OUTPUT_DIR": str(tmp_path / "out"), "MLM_LOG_FORMAT": "text"}
    with pytest.raises(ConfigError, match="phases: a branch trains one set of options"):
        launcher.main(["branch", str(tmp_path / "checkpoint-4"), "--config", str(plan)], env)
    assert not (tmp_path / "out").exists()


def test_a_branch_refused_after_its_checkpoint_was_copied_in_leaves_nothing(parent: Path, tmp_path: Path) -> None:
    """Its max_steps already reached by the parent's step: refused once the parent's options are known (after the
    copy), and the output_dir is left as it was - no branch.json, no copy to resume a branch that never began."""
    out = tmp_path / "out"
    out.mkdir()
    env = {"MLM_OUTPUT_DIR": str(out), "MLM_LOG_FORMAT": "text"}
    with pytest.raises(ConfigError, match="max_steps=15: the branch starts at step 20 of its parent"):
        launcher.main(["branch", str(parent), "--max_steps", "15"], env)
    assert list(out.iterdir()) == []


def test_a_branch_point_honours_a_new_learning_rate(parent: Path, tmp_path: Path) -> None:
    """A directory's resume from its branch point does not say the optimizer keeps the parent's learning rate (the
    branch scales the restored schedule to its own); the same checkpoint, were it no branch point, still would."""
    from train.config import load_config
    from train.outputs.location import output_location

    files = RunFiles(tmp_path / "branch")
    files.root.mkdir()
    seed(files, str(parent))
    location = output_location(load_config([], {"MLM_OUTPUT_DIR": str(files.root), "MLM_LEARNING_RATE": "5e-4"}))
    said: list[str] = []
    assert location.choose_resume(said.append) == str(files.checkpoint(20))
    assert not [line for line in said if "learning_rate" in line], said
    files.branch.unlink()  # the same checkpoint, not a branch point
    location.choose_resume(said.append)
    assert [line for line in said if "learning_rate 0.0005 (checkpoint: 0.001)" in line], said
