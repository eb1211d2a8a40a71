"""python -m train.report: exit 2 with one line without logs, --help, the line naming both files, and the package's
shape (light to import, its modules importing in one direction)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.report.helpers import train_record, write_jsonl
from train.common.errors import run_main
from train.outputs.runfiles import RunFiles
from train.report.__main__ import main

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def test_no_logs_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert run_main(main, [str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mlm-trainer: error: ") and "no training logs" in err[0]
    assert not RunFiles(tmp_path).report.exists()
    assert run_main(main, [str(tmp_path / "missing")]) == 2


def test_writes_both_files_and_says_where(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    files = RunFiles(tmp_path)
    write_jsonl(files.train_jsonl, [train_record(s, 3.0 - s / 10) for s in (1, 2, 3)])
    assert run_main(main, [str(tmp_path)]) == 0
    assert files.report.is_file() and files.loss_png.is_file()
    assert f"report: {files.report} (and {files.loss_png})" in capsys.readouterr().err  # say(): stderr


def test_cli_exit_codes(tmp_path: Path):
    done = subprocess.run([PYTHON, "-m", "train.report", str(tmp_path)], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    usage = subprocess.run([PYTHON, "-m", "train.report"], cwd=REPO, capture_output=True, text=True)
    assert usage.returncode == 2 and "OUTPUT_DIR" in usage.stderr


def test_help_without_warnings():
    """-W error: runpy warns when the package itself imported its __main__ (train/report/__main__.py's docstring)."""
    done = subprocess.run(
        [PYTHON, "-W", "error", "-m", "train.report", "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0 and "OUTPUT_DIR" in done.stdout and done.stderr == "", done.stderr


def test_importing_the_package_loads_no_plotting_or_torch():
    """train.run.job imports write_report when a run ends: the import itself must not pay for matplotlib or torch."""
    code = "import sys, train.report; print(sorted(m for m in ('matplotlib', 'torch', 'transformers') if m in sys.modules))"
    done = subprocess.run([PYTHON, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


ORDER = ["runlog", "schedule", "plots", "page", "__main__"]


def test_modules_import_in_one_direction():
    """Each module of train/report/ imports only the ones before it in ORDER: no circle (plots once imported its
    types from the module that imported plots)."""
    package = REPO / "train" / "report"
    assert sorted(p.stem for p in package.glob("*.py")) == sorted([*ORDER, "__init__"])
    for position, name in enumerate(ORDER):
        tree = ast.parse((package / f"{name}.py").read_text())
        imported = {
            node.module.split(".")[2]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("train.report.")
        }
        assert imported <= set(ORDER[:position]), (name, imported)
        assert not any(isinstance(node, ast.ImportFrom) and node.module == "train.report" for node in ast.walk(tree)), (
            f"{name} imports the package (its __init__ imports page, which imports the rest)"
        )
