"""train.common.console: the prefix, levels and JSON records every module's user-facing lines go through."""

from __future__ import annotations

import io
import json

from train.common import console
from train.common.errors import ConfigError, run_main


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

    script = "import sys; from train.common.errors import run_main; sys.exit(run_main(lambda a: [print('x' * 100) for _ in range(10**5)]))"
    reader = subprocess.Popen(["head", "-c", "10"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    writer = subprocess.run(
        [sys.executable, "-c", script], stdout=reader.stdin, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    reader.stdin.close()
    reader.wait()
    assert writer.returncode == 141 and writer.stderr == ""


def test_exit_process_keeps_the_code_and_what_shutdown_does(tmp_path):
    """gc.freeze() skips only the last collection: atexit handlers run, threads are joined, open files flushed."""
    import subprocess
    import sys

    script = f"""
import atexit, threading, time
from pathlib import Path
from train.common.errors import exit_process
out = open({str(tmp_path / "buffered.txt")!r}, "w")
out.write("written before exit")  # never closed: flushed when shutdown clears the module
atexit.register(lambda: Path({str(tmp_path / "atexit.txt")!r}).write_text("ran"))
threading.Thread(target=lambda: (time.sleep(0.3), Path({str(tmp_path / "thread.txt")!r}).write_text("done"))).start()
exit_process(75)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 75, done.stderr
    assert (tmp_path / "atexit.txt").read_text() == "ran"
    assert (tmp_path / "thread.txt").read_text() == "done"
    assert (tmp_path / "buffered.txt").read_text() == "written before exit"


def test_a_process_that_loaded_triton_ends_on_its_last_word_unless_the_launchers_relay_reads_its_stderr():
    """torch 2.15 imports triton with torch._dynamo (transformers 5.25's models do): objects frozen at exit are still
    alive when triton's nanobind bindings are torn down, which then print a "leaked" report. A process on its own
    takes the last collection and ends on its last word; a rank the launcher started (its handoff in the
    environment) freezes all the same, and the launcher's relay drops the report (tests/launch/test_torchrun.py)."""
    import os
    import subprocess
    import sys

    from train.common.handoff import HANDOFF_ENV
    from train.launch.relay import StderrRelay

    script = "import sys, triton; from train.common.errors import exit_process; print('last word', file=sys.stderr)"
    alone = {k: v for k, v in os.environ.items() if k not in (HANDOFF_ENV, "MLM_DEBUG")}
    done = subprocess.run([sys.executable, "-c", script + "; exit_process(3)"], capture_output=True, env=alone)
    assert done.returncode == 3 and done.stderr == b"last word\n", done.stderr[:500]
    launched = {**alone, HANDOFF_ENV: "{}"}
    done = subprocess.run([sys.executable, "-c", script + "; exit_process(3)"], capture_output=True, env=launched)
    assert done.returncode == 3 and done.stderr.startswith(b"last word\nnanobind: leaked"), done.stderr[:500]
    sink = io.BytesIO()
    relay = StderrRelay(sink)
    relay.feed(done.stderr)
    relay.finish(drop_report=True)
    assert sink.getvalue() == b"last word\n"
    debugging = {**launched, "MLM_DEBUG": "1"}  # the relay keeps the ranks' every line: nothing to drop then
    done = subprocess.run([sys.executable, "-c", script + "; exit_process(3)"], capture_output=True, env=debugging)
    assert done.returncode == 3 and done.stderr == b"last word\n", done.stderr[:500]
