"""``finetune --task_all_checkpoints true``: every checkpoint and the final model of a run fine-tuned, each verified
first (a damaged one skipped in one line), placed by the step, tokens and time the run recorded; the model the run
started from scored too ("before pretraining"); the run's report drawing the series beside the held-out loss. The
run is made here: the tiny model of tests/commands/finetune/test_command.py saved as a run saves its checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.commands.finetune.test_command import TINY, build_model, write_task
from tests.report.helpers import charts_of, markers, svgs, train_record, write_jsonl
from train.commands.finetune import command as finetune
from train.commands.finetune.command import main
from train.commands.finetune.series import points, run_of, starting_model
from train.common.errors import ConfigError
from train.outputs.marker import write_marker
from train.outputs.runfiles import TRAINER_STATE, RunFiles
from train.report import plots
from train.report.runlog import load_run

STEPS = (2, 4, 6)


def evaluation(step: int) -> dict:
    return {"event": "eval", "step": step, "eval_loss": 5.0 - step / 4, "since_launch_s": 30.0 * step,
            "tokens_seen": 1000 * step}  # fmt: skip


def make_run(root: Path, start: str) -> RunFiles:
    """A run's output_dir started from ``start``: checkpoint-2, -4, -6 and final/ (step 6), each with its marker;
    logs with an evaluation at steps 2 and 6 (none at 4) and the end record; run.json naming the start."""
    files = RunFiles(root)
    model = build_model(root / "model")
    for step in STEPS:
        checkpoint = files.checkpoint(step)
        shutil.copytree(model, checkpoint)
        state = {"global_step": step, "num_input_tokens_seen": 1000 * step, "log_history": []}
        (checkpoint / TRAINER_STATE).write_text(json.dumps(state))
        write_marker(checkpoint)
    model.rename(files.final)
    write_marker(files.final)
    records = [{"event": "banner", "start_step": 0}, train_record(2, 6.0), evaluation(2), train_record(4, 5.0)]
    records += [train_record(6, 4.0), evaluation(6), {"event": "train_end", "step": 6, "num_input_tokens_seen": 6000}]
    write_jsonl(files.train_jsonl, records)
    files.run_json.write_text(json.dumps({"status": "finished", "config": {"model_name_or_path": start}}))
    return files


START = "org/tiny-start"  # the hub id a run started from, in the hub cache (offline)


@pytest.fixture
def on_the_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """START in a hub cache of this test's own, as a download leaves it (the tests are offline)."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    snapshot = cache / f"models--{START.replace('/', '--')}" / "snapshots" / ("0" * 40)
    build_model(snapshot)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return START


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_task(tmp_path_factory.mktemp("task") / "licences")


def series_of(files: RunFiles, task: Path, output: Path, *extra: str) -> dict:
    args = ["--model_name_or_path", str(files.root), "--task", str(task), "--output_dir", str(output)]
    assert main([*args, "--task_all_checkpoints", "true", *TINY, *extra]) == 0
    return json.loads((output / "finetune_results.json").read_text())


def test_every_checkpoint_is_scored_in_order_a_damaged_one_skipped_and_the_report_draws_the_series(
    task: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], on_the_hub: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = on_the_hub
    files = make_run(tmp_path / "run", start)
    splits = []
    tokenize = finetune.tokenized
    monkeypatch.setattr(finetune, "tokenized", lambda split, *args: splits.append(len(split)) or tokenize(split, *args))
    weights = files.checkpoint(4) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)  # a flipped tail: its digest is no longer the listed one
    run_json = files.run_json.read_bytes()
    results = series_of(files, task, files.root, "--task_baselines", "true")
    series = results["series"]
    assert [(p["model"], p["step"], p["tokens_seen"], p["since_launch_s"]) for p in series] == [
        ("checkpoint-2", 2, 2000, 60.0),
        ("checkpoint-6", 6, 6000, 180.0),
        ("final", 6, 6000, 180.0),
    ]
    for point in series:
        assert [run["seed"] for run in point["seeds"]] == [0, 1] and set(point["mean"]) == {
            "accuracy",
            "macro_f1",
            "mcc",
        }
    assert results["starting"]["model"] == str(start) and len(results["starting"]["seeds"]) == 2
    assert len(results["baseline"]["seeds"]) == 2 and "pretrained" not in results
    # the run's three models carry copies of one tokenizer: the task is tokenized once for them, and once for the
    # starting model (built apart: WordPiece's training orders pieces of equal count differently), not once a model
    assert splits == [results["train_examples"], results["test_examples"]] * 2
    err = capsys.readouterr().err
    (skipped,) = [line for line in err.splitlines() if "skipping" in line]
    assert f"{files.checkpoint(4)}: model.safetensors" in skipped and "warning" in skipped
    assert err.count("finetune checkpoint-2 seed") == 2 and err.count("finetune before pretraining seed") == 2
    (said,) = [line for line in err.splitlines() if "written to" in line]
    assert "checkpoint-2 (step 2): accuracy" in said and "final (step 6)" in said
    assert f"before pretraining ({start}): accuracy" in said and "random-init baseline: accuracy" in said
    assert files.run_json.read_bytes() == run_json  # the training job's record is left as it wrote it
    charts = charts_of(files.report.read_text())  # drawn again by finetune: the series is in the run's directory
    # the time chart: checkpoint-2 and the two at step 6 (the evaluations' steps); tokens: the same three
    assert markers(svgs(charts["downstream-time"])[0], "downstream-accuracy-since-launch-s") == 3
    assert markers(svgs(charts["downstream-tokens"])[0], "downstream-accuracy-tokens-seen") == 3
    figure = plots.downstream_figure(load_run(files.root), "since_launch_s", "t", "minutes", 60.0)
    assert list(figure.axes[0].lines[0].get_xdata()) == [1.0, 3.0, 3.0]  # minutes since the launch
    assert list(figure.axes[1].lines[0].get_ydata()) == [4.5, 3.5]  # the held-out loss beside it


def test_a_model_placed_where_the_run_recorded_it_without_an_evaluation_at_its_step(tmp_path: Path) -> None:
    files = make_run(tmp_path / "run", "scratch:distilbert")
    located = points(files, [files.checkpoint(4), files.final])
    assert [(p.step, p.tokens_seen, p.since_launch_s) for p in located] == [(4, 4000, None), (6, 6000, 180.0)]
    assert starting_model(files.root, print) is None  # a run from scratch has nothing before its pretraining
    assert run_of(str(files.final)) == files.root.resolve() and run_of("bert-base-uncased") is None


def test_a_single_model_of_a_run_from_a_pretrained_model_is_scored_beside_it(
    task: Path, tmp_path: Path, on_the_hub: str
) -> None:
    start = on_the_hub
    files = make_run(tmp_path / "run", start)
    args = ["--model_name_or_path", str(files.final), "--task", str(task), "--output_dir", str(tmp_path / "out")]
    assert main([*args, *TINY, "--task_seeds", "1"]) == 0
    results = json.loads((tmp_path / "out" / "finetune_results.json").read_text())
    assert results["starting"]["model"] == str(start) and len(results["pretrained"]["seeds"]) == 1
    assert "series" not in results


def test_a_starting_model_that_cannot_be_loaded_is_said_and_left_out(
    task: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = make_run(tmp_path / "run", "org/not-cached")
    args = ["--model_name_or_path", str(files.final), "--task", str(task), "--output_dir", str(tmp_path / "out")]
    assert main([*args, *TINY, "--task_seeds", "1"]) == 0
    assert "starting" not in json.loads((tmp_path / "out" / "finetune_results.json").read_text())
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "started from" in line]
    assert f"{files.run_json}: model_name_or_path" in line and "org/not-cached" in line


def test_a_local_starting_model_a_run_json_names_is_never_opened(
    task: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run.json is data (docs/trust.md): a path in it could lead the read anywhere on the machine."""
    start = build_model(tmp_path / "elsewhere")
    files = make_run(tmp_path / "run", str(start))
    args = ["--model_name_or_path", str(files.final), "--task", str(task), "--output_dir", str(tmp_path / "out")]
    assert main([*args, *TINY, "--task_seeds", "1"]) == 0
    assert "starting" not in json.loads((tmp_path / "out" / "finetune_results.json").read_text())
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "started from" in line]
    assert f"names {str(start)!r}, a local path, and a path read from a run's record is never opened" in line


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("nowhere", r"--model_name_or_path='.*nowhere': no such directory; expected a run's output_dir$"),
        ("empty", r"--model_name_or_path='.*empty': holds no checkpoint-N/ nor final/; expected a run's output_dir$"),
        ("s3://bucket/run", r"--task_all_checkpoints=true reads a run's output_dir on this machine"),
        ("damaged", r"--model_name_or_path='.*damaged': no intact checkpoint or final model in it$"),
    ],
)
def test_a_run_directory_that_is_none_is_refused_in_one_line(
    task: Path, tmp_path: Path, where: str, expected: str
) -> None:
    target = where if where.startswith("s3:") else str(tmp_path / where)
    if where == "empty":
        (tmp_path / where).mkdir()
    if where == "damaged":
        files = make_run(tmp_path / where, "scratch:distilbert")
        for model in [*files.checkpoints(), files.final]:
            (model / "config.json").write_text("{}")
    args = ["--model_name_or_path", target, "--task", str(task), "--output_dir", str(tmp_path / "out")]
    with pytest.raises(ConfigError, match=expected) as refused:
        main([*args, "--task_all_checkpoints", "true"])
    assert "\n" not in str(refused.value) and not (tmp_path / "out").exists()


def test_a_rerun_while_the_run_goes_on_fine_tunes_only_the_models_saved_since(
    task: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], on_the_hub: str
) -> None:
    """finetune run again over the same run (as a job repeated while it trains): the models it scored before, the
    same weights with the same task, recipe and ranks, keep their scores, and so do the model the run started from
    and the random-init baseline; a new checkpoint, or one whose weights changed, is fine-tuned. Another recipe
    reuses nothing."""
    files = make_run(tmp_path / "run", on_the_hub)
    shutil.rmtree(files.final)
    shutil.rmtree(files.checkpoint(6))
    output = tmp_path / "scores"
    first = series_of(files, task, output, "--task_baselines", "true")
    assert [p["model"] for p in first["series"]] == ["checkpoint-2", "checkpoint-4"]
    assert first["starting"]["model"] == START and first["baseline"]["model"] == str(files.root)
    capsys.readouterr()
    shutil.copytree(files.checkpoint(4), files.checkpoint(6))  # saved since, with other weights:
    weights = files.checkpoint(6) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)  # the last parameter's last values changed
    state = {"global_step": 6, "num_input_tokens_seen": 6000, "log_history": []}
    (files.checkpoint(6) / TRAINER_STATE).write_text(json.dumps(state))
    write_marker(files.checkpoint(6))
    second = series_of(files, task, output, "--task_baselines", "true")
    err = capsys.readouterr().err
    assert [p["model"] for p in second["series"]] == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert "finetune checkpoint-2: scored before" in err and "finetune checkpoint-4: scored before" in err
    assert f"finetune before pretraining ({START}): scored before" in err
    assert f"finetune random-init baseline ({files.root}): scored before" in err
    assert second["series"][0]["mean"] == first["series"][0]["mean"]
    assert (second["starting"], second["baseline"]) == (first["starting"], first["baseline"])
    # only checkpoint-6, whose weights differ, was fine-tuned (checkpoint-2 and -4 are copies of one model)
    assert err.count("finetune checkpoint-6 seed") == 2 and err.count(" seed ") == 2
    third = series_of(files, task, output, "--task_seeds", "1")  # another recipe: every model fine-tuned again
    err = capsys.readouterr().err
    assert "scored before" not in err and third["recipe"]["seeds"] == [0] and "baseline" not in third
    assert err.count("before pretraining seed") == 1
