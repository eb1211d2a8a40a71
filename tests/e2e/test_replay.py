"""./entrypoint.sh replay RUN_JSON: a finished run's recipe run again, refused where something would make it differ,
and its final/ compared with the recorded one (on this CPU, the same image: identical)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import tiny_env
from tests.e2e.runs import entrypoint, launcher_here

pytestmark = pytest.mark.slow


def test_a_run_replays_to_identical_files_and_differences_are_refused_or_said(
    tmp_path: Path, capsys: Any, job_in_process: Any
) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i} of a small corpus for the replay test\n" for i in range(300)))
    original = tmp_path / "run"
    done = entrypoint(env=tiny_env(original, dataset=str(corpus), max_steps="4", warmup_steps="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads((original / "run.json").read_text())
    assert (
        run["options"]["max_steps"] == 4 and "output_dir" not in run["options"] and "model.safetensors" in run["final"]
    )

    # the recipe alone: no MLM_* option from the environment but where the outputs go
    bare = {k: v for k, v in tiny_env(tmp_path / "unused").items() if not k.startswith("MLM_")}
    replayed = entrypoint("replay", str(original / "run.json"), env=bare)
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    assert "identical: every file of final/ has the recorded SHA-256" in replayed.stderr
    assert (tmp_path / "run-replay" / "final" / "model.safetensors").exists()

    corpus.write_text(corpus.read_text() + "one more line\n")  # the data changed, and an option in the environment
    code, said = launcher_here(
        capsys, {**bare, "MLM_MAX_GRAD_NORM": "0.5"}, "replay", str(original / "run.json"), "--output_dir",
        str(tmp_path / "r2"),
    )  # fmt: skip
    assert code == 2, said[-3000:]
    assert "MLM_MAX_GRAD_NORM: max_grad_norm 0.5 (recorded: 1.0)" in said
    assert "data fingerprint" in said and "refused, 2 difference(s) above; --anyway" in said
    assert not (tmp_path / "r2").exists()

    # a run.json planted in a shared volume that asks for the model's own code and a push: neither is granted
    planted = tmp_path / "shared" / "run.json"
    planted.parent.mkdir()
    planted.write_text(
        json.dumps({**run, "options": {**run["options"], "trust_remote_code": True, "push_to_hub": True}})
    )
    code, said = launcher_here(capsys, bare, "replay", str(planted), "--output_dir", str(tmp_path / "r4"))
    assert code == 2, said[-3000:]
    assert "add --trust_remote_code true to the replay" in said and "Traceback" not in said
    assert not (tmp_path / "r4").exists()
    planted.write_text(json.dumps({**run, "final": ["model.safetensors"]}))  # a field of the wrong shape
    code, said = launcher_here(capsys, bare, "replay", str(planted), "--output_dir", str(tmp_path / "r5"))
    assert code == 2 and "final is not a mapping of final/'s file names" in said
    assert "Traceback" not in said and not (tmp_path / "r5").exists()

    # a resume from the run's checkpoint on the corpus replaced in place: refused, then asked for and recorded (the
    # rank's decision, train/run/resuming.py: the job's main() in this process)
    resumed = tiny_env(tmp_path / "resumed", dataset=str(corpus), max_steps="6", resume=str(original / "checkpoint-4"))
    capsys.readouterr()
    code = job_in_process(resumed)
    said = capsys.readouterr().err
    assert code == 2, said[-3000:]
    assert "checkpoint-4 was saved while training on other data (corpus.txt: " in said
    assert "MLM_RESUME_ON_CHANGED_DATA=true" in said and "Traceback" not in said
    assert job_in_process({**resumed, "MLM_RESUME_ON_CHANGED_DATA": "true"}) == 0, capsys.readouterr().err[-3000:]
    run_json = json.loads((tmp_path / "resumed" / "run.json").read_text())
    assert run_json["resumed_on_changed_data"][0].startswith("corpus.txt: ")
    assert "| resumed on changed data | corpus.txt: " in (tmp_path / "resumed" / "final" / "README.md").read_text()

    changed = entrypoint(
        "replay", str(original / "run.json"), "--output_dir", str(tmp_path / "r3"), "--learning_rate", "1e-3", "--anyway",
        env=bare,
    )  # fmt: skip
    assert changed.returncode == 0, changed.stderr[-3000:]
    assert "no longer a replay" in changed.stderr and "learning_rate named on the command line" in changed.stderr
    # the data changed too (--anyway): a new tokenizer, other weights, and how far they are
    said = changed.stderr.split("differs from the recorded run: ", 1)[1].split('"', 1)[0]
    assert "model.safetensors" in said and "tokenizer.json" in said and "largest absolute difference is" in said
