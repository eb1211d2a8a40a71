"""./entrypoint.sh replay RUN_JSON: a finished run's recipe run again, refused where something would make it differ,
and its final/ compared with the recorded one (on this CPU, the same image: identical)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import tiny_env
from tests.e2e.runs import entrypoint

pytestmark = pytest.mark.slow


def launcher_here(capsys: Any, env: dict[str, str], *args: str) -> tuple[int, str]:
    """The launcher's main() in this process, as ./entrypoint.sh would run it with ``args`` and ``env``: its exit
    code and what it wrote to stderr. For the refusals, which end before torchrun (a launch's start-up is seconds)."""
    from train.common.errors import run_main
    from train.launch.__main__ import main as launcher

    capsys.readouterr()
    code = run_main(lambda argv: launcher(argv, env), list(args))
    return code, capsys.readouterr().err


def test_a_run_replays_to_identical_files_and_differences_are_refused_or_said(tmp_path: Path, capsys: Any) -> None:
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

    # a resume from the run's checkpoint on the corpus replaced in place: refused, then asked for and recorded
    resumed = tiny_env(tmp_path / "resumed", dataset=str(corpus), max_steps="6", resume=str(original / "checkpoint-4"))
    refused = entrypoint(env=resumed)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "checkpoint-4 was saved while training on other data (corpus.txt: " in refused.stderr
    assert "MLM_RESUME_ON_CHANGED_DATA=true" in refused.stderr and "Traceback" not in refused.stderr
    told = entrypoint(env={**resumed, "MLM_RESUME_ON_CHANGED_DATA": "true"})
    assert told.returncode == 0, told.stderr[-3000:]
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
