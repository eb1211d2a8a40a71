"""A branch's options (train/launch/branch_options.py): its parent's recorded recipe as flags, less what the branch
sets, what a record may not decide, and names this version does not know; then parsed as the options' own."""

from __future__ import annotations

from train.config import load_config
from train.launch.branch_options import inherited, parent_recipe
from train.outputs.branch import BranchPoint
from train.outputs.checkpoints import RECIPE

RECORDED = {
    "model_name_or_path": "scratch:bert",
    "lr_scheduler_type": "warmup_stable_decay",
    "learning_rate": 1e-3,
    "report_to": ["mlflow"],
    "trust_remote_code": True,
    "push_to_hub": True,
    "output_dir": "/elsewhere",
    "dataset": {"a.txt": 0.7, "b.txt": 0.3},
    "an_option_of_a_later_version": 1,
}


def point(options: dict) -> BranchPoint:
    return BranchPoint("parent/checkpoint-20", "checkpoint-20", 20, options, "now")


def test_the_parents_options_are_taken_but_those_the_branch_sets_and_those_a_record_may_not_decide() -> None:
    given = load_config(["--learning_rate", "5e-4"], {"MLM_OUTPUT_DIR": "/branch"})
    flags, taken = inherited(parent_recipe(point({RECIPE: RECORDED})), given.sources, given.as_dict().keys())
    assert taken == ["dataset", "lr_scheduler_type", "model_name_or_path"]
    assert flags == [
        "--dataset", '{"a.txt": 0.7, "b.txt": 0.3}', "--lr_scheduler_type", "warmup_stable_decay",
        "--model_name_or_path", "scratch:bert",
    ]  # fmt: skip
    merged = load_config([*flags, "--learning_rate", "5e-4"], {"MLM_OUTPUT_DIR": "/branch"})
    assert (merged.training.learning_rate, merged.model.model_name_or_path) == (5e-4, "scratch:bert")
    assert not merged.model.trust_remote_code and merged.training.output_dir == "/branch"


def test_a_checkpoint_that_recorded_no_recipe_gives_nothing() -> None:
    assert parent_recipe(point({"learning_rate": 1e-3})) == {}
    assert parent_recipe(point({RECIPE: ["not", "a", "mapping"]})) == {}
