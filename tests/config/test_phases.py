"""The YAML's phase plan (train/config/phases.py): read as data, each mistake named by phase and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from train.common.errors import ConfigError
from train.config import load_config, phase_flags, phases_in


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return str(path)


def test_phases_are_read_with_their_lengths_and_options(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "learning_rate: 0.001\nphases:\n  - steps: 10\n    max_seq_length: 128\n    dataset: {a: 0.7, b: 0.3}\n"
        "  - name: decay\n    tokens: 4096\n    decay: true\n",
    )
    first, second = phases_in(path)
    assert (first.name, first.steps, first.tokens, first.decay) == ("phase-1", 10, None, False)
    assert (second.name, second.steps, second.tokens, second.decay) == ("decay", None, 4096, True)
    assert phase_flags(first) == ["--max_seq_length", "128", "--dataset", '{"a": 0.7, "b": 0.3}']
    assert load_config(["--config", path], {}).training.learning_rate == 0.001  # phases: is no option
    assert phases_in(write(tmp_path, "learning_rate: 0.001\n")) == []


@pytest.mark.parametrize(
    ("phases", "said"),
    [
        ("phases: 3", "expected a list of phases"),
        ("phases: [3]", r"phases\[0\]: expected a mapping"),
        ("phases:\n  - {steps: 4, learning_rat: 0.1}", "'learning_rat' cannot change between phases"),
        ("phases:\n  - {steps: 4, max_seq_lenght: 64}", "did you mean max_seq_length"),
        ("phases:\n  - {max_seq_length: 64}", "steps or tokens \\(exactly one\\)"),
        ("phases:\n  - {steps: 4, tokens: 9}", "steps or tokens \\(exactly one\\)"),
        ("phases:\n  - {steps: 0}", "steps: expected a whole number of at least 1"),
        ("phases:\n  - {steps: 2.5}", "steps: expected a whole number of at least 1"),
        ("phases:\n  - {steps: 4, decay: yes please}", "decay: expected true or false"),
        ("phases:\n  - {steps: 4}\n  - {steps: 4, name: ''}", r"phases\[1\]: name: expected a non-empty string"),
    ],
)
def test_a_wrong_phase_is_named_with_its_key(tmp_path: Path, phases: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        phases_in(write(tmp_path, phases + "\n"))
