"""train/launch/replay.py's rules on a recorded run.json (no run here; tests/e2e/test_replay.py runs them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from train.common.errors import ConfigError
from train.common.versions import package_versions
from train.config import load_config
from train.launch.replay import (
    compare_final,
    differences,
    flag_values,
    read_run,
    replay_argv,
    split_args,
    withheld,
)
from train.outputs.marker import mark_complete
from train.outputs.record import RecordedRun, read_recorded

DOCUMENT = {
    "status": "finished",
    "options": {"learning_rate": 0.0005, "report_to": ["none"], "streaming": False, "config_overrides": {"dim": 64}},
    "config": {"learning_rate": 0.0005, "max_grad_norm": 1.0, "log_format": "json"},
    "versions": {},
    "world_size": 1,
    "dataset_fingerprint": "demo-400",
    "image_revision": None,
    "final": {"model.safetensors": "00"},
}
RUN = read_recorded(DOCUMENT, "run.json")


def recorded(**fields: object) -> RecordedRun:
    return read_recorded({**DOCUMENT, **fields}, "run.json")


def test_the_recipe_becomes_flags_and_the_command_line_wins() -> None:
    assert flag_values("report_to", ["none", "mlflow"]) == ["--report_to", "none", "mlflow"]
    assert flag_values("streaming", False) == ["--streaming", "false"]
    assert flag_values("config_overrides", {"dim": 64}) == ["--config_overrides", '{"dim": 64}']
    argv = replay_argv(RUN, "/runs/a/run.json", ["--learning_rate", "1e-3"])
    assert argv[-2:] == ["--learning_rate", "1e-3"] and argv.count("--learning_rate") == 1
    assert argv[argv.index("--output_dir") + 1] == "/runs/a-replay"
    assert replay_argv(RUN, "/runs/a/run.json", ["--output_dir", "/x"]).count("--output_dir") == 1
    assert split_args(["run.json", "--anyway", "--seed", "3"]) == ("run.json", ["--seed", "3"], True)
    with pytest.raises(ConfigError, match="usage: ./entrypoint.sh replay RUN_JSON"):
        split_args(["--seed", "3"])


def test_what_would_differ_is_one_line_each_and_how_a_run_is_watched_is_not() -> None:
    config = load_config(["--learning_rate", "0.0005"], {"MLM_MAX_GRAD_NORM": "0.5", "MLM_LOG_FORMAT": "text"})
    run = recorded(versions={"torch": "0.0.1", **{k: v for k, v in package_versions().items() if k != "torch"}})
    found = differences(run, config, [], world_size=2, fingerprint="demo-401")
    assert found[0].startswith("MLM_MAX_GRAD_NORM: max_grad_norm 0.5 (recorded: 1.0)")
    assert any(line.startswith("torch ") and line.endswith("(recorded: 0.0.1)") for line in found)
    assert any(line.startswith("world size 2 (recorded: 1)") for line in found)
    assert any(line.startswith("data fingerprint demo-401 (recorded: demo-400)") for line in found)
    assert len(found) == 4  # log_format is how the run is watched, not what it computes


def test_only_a_finished_runs_record_replays(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**DOCUMENT, "status": "preempted", "final": None}))
    with pytest.raises(ConfigError, match="the run did not finish"):
        read_run(str(path))
    path.write_text(json.dumps({"status": "finished"}))
    with pytest.raises(ConfigError, match="no recipe in it"):
        read_run(str(path))
    with pytest.raises(ConfigError, match="cannot read a run.json there"):
        read_run(str(tmp_path / "missing.json"))


def test_weights_that_differ_after_a_gpu_run_say_what_determinism_needs(tmp_path: Path) -> None:
    final = tmp_path / "replay" / "final"
    final.mkdir(parents=True)
    (final / "model.safetensors").write_bytes(b"not the recorded weights")
    mark_complete(final)
    location = str(tmp_path / "run" / "run.json")  # no original final/ beside it: no distance to measure
    on_gpus = recorded(hardware={"gpus": ["NVIDIA H100 80GB HBM3"]})
    said = compare_final(on_gpus, location, final)
    assert said.startswith("differs from the recorded run: model.safetensors") and "MLM_FULL_DETERMINISM=true" in said
    deterministic = recorded(hardware={"gpus": ["H100"]}, config={**DOCUMENT["config"], "full_determinism": True})
    assert "MLM_FULL_DETERMINISM" not in compare_final(deterministic, location, final)
    assert "MLM_FULL_DETERMINISM" not in compare_final(RUN, location, final)  # on CPU the runs are the same


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("options", ["--seed", "3"], "options is not a mapping of option names"),
        ("options", {"seed": [{"nested": 1}]}, "options is not a mapping of option names"),
        ("final", ["model.safetensors"], "final is not a mapping of final/'s file names"),
        ("final", {"model.safetensors": 1}, "final is not a mapping"),
        ("versions", {"torch": 2.15}, "versions is not a mapping of package names"),
        ("world_size", "2", "world_size is not a whole number"),
        ("world_size", 0, "world_size is not a whole number"),
        ("world_size", True, "world_size is not a whole number"),
        ("config", [], "config is not a mapping"),
        ("dataset_fingerprint", 7, "dataset_fingerprint is not a string"),
        ("hardware", {"gpus": "H100"}, "hardware.gpus is not a list"),
        ("phase", {"index": 1, "count": 2}, "the run ran in phases: its record holds its last launch's options"),
        ("branch", {"parent": "x", "step": 3}, "the run is a branch of another run"),
    ],
)
def test_a_run_json_of_the_wrong_shape_is_one_line_naming_the_field(
    tmp_path: Path, field: str, value: object, said: str
) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**DOCUMENT, field: value}))
    with pytest.raises(ConfigError, match=f"^replay {path}: {said}"):
        read_run(str(path))


def test_a_record_decides_neither_remote_code_nor_the_network_nor_where_the_replay_writes() -> None:
    run = recorded(
        options={
            **DOCUMENT["options"], "trust_remote_code": True, "push_to_hub": True, "hub_model_id": "them/model",
            "report_to": ["mlflow"], "logging_dir": "/elsewhere", "overwrite_output_dir": True, "resume": "true",
        }
    )  # fmt: skip
    argv = replay_argv(run, "/runs/a/run.json", [])
    for name in ("trust_remote_code", "push_to_hub", "hub_model_id", "report_to", "logging_dir", "overwrite_output_dir",
                 "resume"):  # fmt: skip
        assert f"--{name}" not in argv, name
    assert argv[argv.index("--output_dir") + 1] == "/runs/a-replay"
    config = load_config(argv, {})
    with pytest.raises(ConfigError, match=r"trust_remote_code=true .* add --trust_remote_code true to the replay"):
        withheld(run, config.model, config.sources, "/runs/a/run.json")
    asked = replay_argv(run, "/runs/a/run.json", ["--trust_remote_code", "true"])
    allowed = load_config(asked, {})
    said = withheld(run, allowed.model, allowed.sources, "/runs/a/run.json")
    assert said == ["push_to_hub=True", "hub_model_id='them/model'", "report_to=['mlflow']"]
    from_env = load_config(argv, {"MLM_TRUST_REMOTE_CODE": "true", "MLM_REPORT_TO": "mlflow"})
    assert withheld(run, from_env.model, from_env.sources, "/runs/a/run.json") == [
        "push_to_hub=True",
        "hub_model_id='them/model'",
    ]
