"""help, -h and --help wherever a user types them: a short usage and exit 0; `help options` the option list."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from train.commands.prepare import main as prepare_main
from train.common.usage import COMMANDS, usage
from train.config import option_rows
from train.doctor.__main__ import main as doctor_main
from train.launch.__main__ import main as launch_main
from train.machine.__main__ import main as gpus_main
from train.outputs.verify import main as verify_main
from train.report.__main__ import main as report_main

REPO = Path(__file__).resolve().parent.parent


def entrypoint(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPO / "entrypoint.sh"), *args], capture_output=True, text=True, check=False)


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["help"], ["train", "--help"], ["doctor", "-h"]])
def test_the_front_door_answers_help_with_a_short_usage(args: list[str]) -> None:
    result = entrypoint(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    command = args[0] if args[0] not in ("help", "-h", "--help") else None
    assert result.stdout.strip() == usage(command)
    assert len(result.stdout.splitlines()) < 25 and "__main__.py" not in result.stdout


def test_every_command_has_its_usage_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    for main, command in (
        (launch_main, "plan"),
        (doctor_main, "doctor"),
        (prepare_main, "prepare"),
        (gpus_main, "gpus"),
    ):
        args = ["plan", "--help"] if command == "plan" else ["--learning_rate", "1e-4", "--help"]
        assert main(args) == 0
        assert capsys.readouterr().out.strip() == usage(command)
    assert verify_main(["--help"]) == 0 and "usage" in capsys.readouterr().out
    assert report_main(["--help"]) == 0 and "OUTPUT_DIR" in capsys.readouterr().out
    assert launch_main(["--help"]) == 0 and capsys.readouterr().out.strip() == usage()  # python -m train --help


def test_help_options_lists_every_documented_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert launch_main(["help", "options"]) == 0
    listed = capsys.readouterr().out
    assert listed.startswith("mlm-trainer options:")
    for name, env, _, _ in option_rows(job_only=True):
        assert f"--{name}  {env}" in listed
    assert launch_main(["help", "options", "--all"]) == 0
    assert "--gradient_checkpointing  MLM_GRADIENT_CHECKPOINTING" in capsys.readouterr().out


def test_an_unknown_help_topic_is_exit_2_naming_the_choices() -> None:
    result = entrypoint("help", "nope")
    assert result.returncode == 2
    assert result.stderr.strip().endswith(
        "help nope: no such command or topic; expected one of " + ", ".join(COMMANDS) + ", options"
    )


def test_a_mistyped_command_is_exit_2_naming_the_nearest_but_programs_still_run() -> None:
    result = entrypoint("trian", "--max_steps", "4")
    assert result.returncode == 2  # not the shell's 127 "command not found"
    (line,) = result.stderr.strip().splitlines()
    assert line.endswith("trian: no such command, nor a program on PATH; did you mean 'train'?")
    assert "expected one of train, plan" in entrypoint("xyzzy").stderr  # nothing near: the list
    ran = entrypoint("bash", "-c", "echo ran; exit 7")  # docker run IMAGE bash: a program is run as given
    assert (ran.returncode, ran.stdout) == (7, "ran\n")
    assert entrypoint("./no-such-script").returncode == 127  # a path is exec's to refuse, as given


def test_the_readme_lists_the_same_commands() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    documented = re.findall(r"^\| `\./entrypoint\.sh (\w+)", readme, flags=re.MULTILINE)
    documented += ["train"] if "./entrypoint.sh [train]" in readme else []
    assert sorted(set(documented)) == sorted(COMMANDS)
