"""train/common/paths.py: one rule for paths from outside the job, and each place that applies it: the output
directory, a checkpoint and its marker, a bucket's keys, a handed-over model's companion files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import checkpoint
from train.common.errors import EXIT_CONFIG, ConfigError
from train.common.paths import first_link_under, inside, name_problem, regular_file
from train.config import load_config
from train.model.companions import MODULES, check_companions, keep_sentence_transformers
from train.outputs.checkpoints import problem
from train.outputs.location import output_location
from train.outputs.runfiles import COMPLETE_MARKER


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("../x", "leads out of its directory"),
        ("a/../../x", "leads out of its directory"),
        ("a/./b", "leads out of its directory"),
        ("/etc/passwd", "an absolute path"),
        ("C:/x", "an absolute path"),
        ("", "not a file name"),
    ],
)
def test_a_name_that_leaves_its_directory_is_refused(name: str, said: str) -> None:
    assert said in (name_problem(name) or "")


def test_a_link_on_the_way_is_named_and_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("not the model's")
    model = tmp_path / "model"
    (model / "1_Pooling").mkdir(parents=True)
    (model / "1_Pooling" / "config.json").write_text("{}")
    (model / "linked").symlink_to(outside)
    assert inside(model, "1_Pooling/config.json") is None and regular_file(model, "1_Pooling/config.json") is None
    assert inside(model, "linked/secret") == f"linked: a symbolic link (to {outside})"
    assert regular_file(model, "1_Pooling") == "1_Pooling: not a regular file"
    assert first_link_under(model) == f"linked (to {outside})"
    assert first_link_under(outside) is None


def test_an_output_directory_holding_a_link_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("someone's file")
    output = tmp_path / "out"
    (output / "logs").mkdir(parents=True)
    (output / "logs" / "train.jsonl").symlink_to(outside)
    config = load_config([], {"MLM_OUTPUT_DIR": str(output)})
    with pytest.raises(
        ConfigError, match=r"logs/train.jsonl \(to .*elsewhere.txt\) is a symbolic link inside it"
    ) as info:
        output_location(config).check()
    assert info.value.exit_code == EXIT_CONFIG and outside.read_text() == "someone's file"
    linked_root = tmp_path / "volume"
    linked_root.symlink_to(tmp_path / "real", target_is_directory=True)
    (tmp_path / "real").mkdir()
    output_location(load_config([], {"MLM_OUTPUT_DIR": str(linked_root)})).check()  # the directory itself may be one


def test_a_checkpoint_with_a_link_or_a_marker_naming_one_is_damaged(tmp_path: Path) -> None:
    path = checkpoint(tmp_path, 10)
    (tmp_path / "elsewhere.json").write_text("{}")
    (path / "extra.json").symlink_to(tmp_path / "elsewhere.json")
    assert problem(path) == f"extra.json (to {tmp_path / 'elsewhere.json'}) is a symbolic link"
    other = checkpoint(tmp_path, 20)
    marker = json.loads((other / COMPLETE_MARKER).read_text())
    marker["files"]["../../elsewhere.json"] = {"size": 2, "sha256": "x"}
    (other / COMPLETE_MARKER).write_text(json.dumps(marker))
    assert problem(other) == "../../elsewhere.json: leads out of its directory (a '..' part) (listed by the marker)"


def sentence_model(tmp_path: Path, modules: list[dict]) -> Path:
    source = tmp_path / "st-model"
    (source / "1_Pooling").mkdir(parents=True)
    (source / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (source / MODULES).write_text(json.dumps(modules))
    return source


ENCODER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}


def test_a_handed_over_models_companions_are_regular_files_inside_it(tmp_path: Path) -> None:
    source = sentence_model(tmp_path, [ENCODER, POOLING, NORMALIZE])
    check_companions(source)
    final = tmp_path / "final"
    final.mkdir()
    said = keep_sentence_transformers(source, final)
    assert said is not None and "(1_Pooling, 2_Normalize)" in said and "not kept" not in said
    assert (final / "2_Normalize").is_dir()  # no files, as sentence-transformers saves a Normalize module
    assert [m["path"] for m in json.loads((final / MODULES).read_text())] == ["", "1_Pooling", "2_Normalize"]

    escaping = sentence_model(tmp_path / "a", [ENCODER, {**POOLING, "path": "../../outside"}])
    with pytest.raises(ConfigError, match=r"\.\./\.\./outside: leads out of its directory .*; final/ keeps only"):
        check_companions(escaping)
    linked = sentence_model(tmp_path / "b", [ENCODER, POOLING])
    (linked / "1_Pooling" / "config.json").unlink()
    (linked / "1_Pooling" / "config.json").symlink_to("/etc/hostname")
    with pytest.raises(ConfigError, match=r"1_Pooling/config.json \(to /etc/hostname\) is a symbolic link"):
        check_companions(linked)
    listed_link = sentence_model(tmp_path / "c", [ENCODER, POOLING])
    (listed_link / "sentence_bert_config.json").symlink_to("/etc/hostname")
    with pytest.raises(ConfigError, match=r"sentence_bert_config.json: a symbolic link \(to /etc/hostname\)"):
        check_companions(listed_link)
    odd = sentence_model(tmp_path / "d", [ENCODER, {**POOLING, "path": 7}])
    with pytest.raises(ConfigError, match=r"a module's path is 7, not a folder name"):
        check_companions(odd)


def test_a_bucket_key_that_would_land_outside_its_checkpoint_is_refused_before_anything_is_read(
    tmp_path: Path, aws: dict[str, str]
) -> None:
    import fsspec

    from train.outputs.store import BadKey, Store

    url = "s3://paths-bucket/run"
    fs = fsspec.filesystem("s3")
    fs.mkdir("paths-bucket")
    fs.pipe("paths-bucket/run/checkpoint-4/trainer_state.json", b"{}")
    fs.pipe("paths-bucket/run/checkpoint-4/../../escaped.json", b"{}")
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(BadKey, match=r"checkpoint-4/\.\./\.\./escaped.json: leads out"):
        Store(url).download_checkpoint(4, staging)
    assert not (tmp_path / "escaped.json").exists() and not any(staging.iterdir())
