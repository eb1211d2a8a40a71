"""The whole command: exit codes, the table, the JSON document, auto format, and a broken check."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO
from tests.doctor.helpers import checks
from tests.fakes import no_driver
from train.common.errors import run_main
from train.doctor import network
from train.doctor.__main__ import main


def rows_of(out: str) -> dict[str, str]:
    return {line.split()[0]: line.split()[1] for line in out.splitlines()[1:] if line and not line.startswith(" ")}


def test_cpu_machine_passes_with_a_warning(env, monkeypatch, capsys):
    no_driver(monkeypatch)
    assert run_main(main, []) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["CHECK", "STATUS", "DETAIL"]
    rows = rows_of(out)
    assert rows["gpus"] == "WARN" and rows["driver"] == "SKIP" and rows["nccl"] == "SKIP"
    assert rows["processes"] == "OK" and rows["output_dir"] == "OK" and rows["model"] == "OK"
    assert rows["dataset"] == "OK" and rows["master"] == "SKIP"
    assert "fix: give the container the GPUs" in out and "Nothing blocks the job (1 WARN)" in out


def test_require_gpu_on_a_cpu_machine_fails_with_exit_3(env, monkeypatch, capsys):
    no_driver(monkeypatch)
    monkeypatch.setenv("MLM_REQUIRE_GPU", "true")
    assert run_main(main, []) == 3
    out = capsys.readouterr().out
    assert rows_of(out)["plan"] == "FAIL" and "MLM_REQUIRE_GPU asks for a GPU" in out and "1 FAIL" in out


def test_json_output(env, monkeypatch, capsys):
    no_driver(monkeypatch)
    monkeypatch.setenv("MLM_LOG_FORMAT", "json")
    assert run_main(main, []) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["ok"] is True
    rows = {c["name"]: c for c in document["checks"]}
    assert rows["gpus"]["status"] == "WARN" and rows["processes"]["data"]["nproc_per_node"] == 1


def test_auto_format_is_json_when_stdout_is_not_a_terminal(env, monkeypatch, capsys):
    # The console's one rule (train.common.console.resolve_format): pytest's captured stdout is not a terminal.
    no_driver(monkeypatch)
    monkeypatch.setenv("MLM_LOG_FORMAT", "auto")
    assert run_main(main, []) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_options_come_from_argv_and_the_given_environment(env, monkeypatch, capsys):
    no_driver(monkeypatch)
    environ = {"MLM_LOG_FORMAT": "json", "MLM_OUTPUT_DIR": env["MLM_OUTPUT_DIR"], "HF_HOME": env["HF_HOME"]}
    assert main(["--model_name_or_path", "scratch:nosuchmodel", "--dataset", "demo"], environ) == 3
    rows = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert rows["model"]["status"] == "FAIL" and "nosuchmodel" in rows["model"]["detail"]


def test_config_error_exits_2(env):
    done = subprocess.run(
        [sys.executable, "-m", "train.doctor", "--num_train_epochs", "many"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlm-trainer: error: ") and "num_train_epochs" in lines[0]


def test_a_broken_check_is_a_fail_row_not_a_crash(env, monkeypatch):
    no_driver(monkeypatch)

    def broken(environ):
        raise KeyError("boom")

    monkeypatch.setattr(network, "check_master", broken)
    found = checks()
    assert found["master"].status == "FAIL" and "KeyError" in found["master"].detail
    assert found["dataset"].status == "OK"
