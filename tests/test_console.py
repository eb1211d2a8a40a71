"""train.console: the prefix, levels and JSON records every module's user-facing lines go through."""

from __future__ import annotations

import io
import json

from train import console
from train.errors import ConfigError, run_main


def test_lines_and_levels(capsys):
    console.say("finished")
    console.warn("careful")
    console.error("broken")
    assert capsys.readouterr().err.splitlines() == [
        "mlm-trainer: finished",
        "mlm-trainer: warning: careful",
        "mlm-trainer: error: broken",
    ]


def test_launcher_console_json_records():
    stream = io.StringIO()
    log = console.Console("json", stream)
    log("torchrun: ...")
    log.warning("small /dev/shm")
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(r["event"], r["level"], r["message"]) for r in records] == [
        ("launch", "info", "torchrun: ..."),
        ("launch", "warning", "small /dev/shm"),
    ]
    assert records[0]["time"].endswith("+00:00")
    text = io.StringIO()
    console.Console("text", text).warning("small /dev/shm")
    assert text.getvalue() == "mlm-trainer: warning: small /dev/shm\n"


def test_run_main_prints_a_user_error_as_one_error_line(capsys):
    def main(argv):
        raise ConfigError("MLM_X='y': expected an integer")

    assert run_main(main, []) == 2
    assert capsys.readouterr().err == "mlm-trainer: error: MLM_X='y': expected an integer\n"


def test_a_closed_pipe_ends_a_sub_command_quietly(tmp_path):
    import subprocess
    import sys

    from tests.conftest import REPO

    script = "import sys; from train.errors import run_main; sys.exit(run_main(lambda a: [print('x' * 100) for _ in range(10**5)]))"
    reader = subprocess.Popen(["head", "-c", "10"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    writer = subprocess.run(
        [sys.executable, "-c", script], stdout=reader.stdin, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    reader.stdin.close()
    reader.wait()
    assert writer.returncode == 141 and writer.stderr == ""
