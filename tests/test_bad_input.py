"""Bad input decided in this process, at the function that decides it: the cases of the end-to-end bad-input matrix
(tests/e2e/test_bad_input.py, which keeps one run through ./entrypoint.sh per exit path) that no unit test held.
Each is one line naming the variable and what is expected, with the documented exit code; MLM_DEBUG=1 shows the
traceback instead. The others: tests/config/ (options, YAML), tests/data/ (data files), tests/launch/ (topology,
plan, the entrypoint's *_FILE secrets), tests/test_outputs.py (output_dir), tests/test_model_source.py (models)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from tests.data.helpers import config_for
from train.common.errors import EXIT_CONFIG, ConfigError, run_main
from train.config import load_config
from train.data.sources import local_files


def one_line(info: pytest.ExceptionInfo[ConfigError]) -> str:
    assert info.value.exit_code == EXIT_CONFIG
    assert "\n" not in str(info.value)
    return str(info.value)


def test_a_data_file_the_user_cannot_read_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a user sees it: root reads any file (CAP_DAC_OVERRIDE), so the check's own question, os.access, answers no."""
    secret = tmp_path / "secret.txt"
    secret.write_text("some text\n")
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: access(path, mode) and Path(path) != secret)
    with pytest.raises(ConfigError) as info:
        local_files(str(secret), "MLM_DATASET")
    assert one_line(info) == f"MLM_DATASET={str(secret)!r}: not readable (permission denied)"
    with pytest.raises(ConfigError, match=r"secret.txt': not readable \(permission denied\)"):
        local_files(str(tmp_path), "MLM_DATASET")  # a directory holding it


def test_max_seq_length_beyond_the_models_positions_names_both() -> None:
    from transformers import DistilBertConfig  # the model layer's test: torch and transformers

    from train.model.load import check_positions

    config = load_config([], {"MLM_MAX_SEQ_LENGTH": "1024"})
    with pytest.raises(ConfigError) as info:
        check_positions(config.data, DistilBertConfig(max_position_embeddings=512))
    assert one_line(info) == "MLM_MAX_SEQ_LENGTH=1024: expected at most 512, the model's max_position_embeddings"
    check_positions(load_config([], {"MLM_MAX_SEQ_LENGTH": "512"}).data, DistilBertConfig(max_position_embeddings=512))


def test_a_hub_tokenizer_offline_and_not_cached_says_what_to_do() -> None:
    from train.model.load import load_tokenizer  # the model layer's test: torch and transformers

    config = config_for("demo", model_name_or_path="someone/bert-nowhere")
    assert os.environ["HF_HUB_OFFLINE"] == "1"  # tests/conftest.py: the hub is never asked
    with pytest.raises(ConfigError) as info:
        load_tokenizer(config.model, config.data, None, None)  # type: ignore[arg-type]
    said = one_line(info)
    assert said.startswith("MLM_MODEL_NAME_OR_PATH='someone/bert-nowhere': cannot load the tokenizer (")
    assert "HF_HUB_OFFLINE is set and the tokenizer is not in the cache" in said and "mount a local copy" in said


def test_a_user_error_is_one_line_and_its_exit_code_unless_debugging(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def main(argv: list[str] | None) -> int:
        raise ConfigError("MLM_DATASET='missing.txt': no such file or directory")

    monkeypatch.delenv("MLM_DEBUG", raising=False)
    assert run_main(main, []) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "MLM_DATASET='missing.txt': no such file" in err and "Traceback" not in err
    monkeypatch.setenv("MLM_DEBUG", "1")
    with pytest.raises(ConfigError, match="missing.txt"):  # the interpreter prints its traceback
        run_main(main, [])


def test_a_ranks_traceback_reaches_the_console_through_the_launcher() -> None:
    """What MLM_DEBUG=1 shows of a rank's error under torchrun: its traceback, passed on whole (only the agent's
    report and its SignalException are held back)."""
    from train.launch.relay import StderrRelay

    traceback = (
        b"Traceback (most recent call last):\n"
        b'  File "/app/train/data/sources.py", line 134, in local_files\n'
        b"    raise ConfigError(...)\n"
        b"train.common.errors.ConfigError: MLM_DATASET='missing.txt': no such file or directory\n"
    )
    sink = io.BytesIO()
    relay = StderrRelay(sink, keep_noise=True)
    relay.feed(traceback)
    relay.finish(drop_report=False)
    assert sink.getvalue() == traceback
