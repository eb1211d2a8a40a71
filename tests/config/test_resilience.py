"""The resilience options (train/config/resilience.py): the fault drill's grammar, its one-line errors, and the
drill refused with a hub push."""

from __future__ import annotations

import pytest

from train.common.errors import ConfigError
from train.config import load_config
from train.config.resilience import Fault, parse_faults


def test_faults_parse_with_their_step_and_rank() -> None:
    assert parse_faults("nan@5") == (Fault("nan", 5),)
    assert parse_faults(" nan@5 , spike@12:1") == (Fault("nan", 5), Fault("spike", 12, 1))
    assert parse_faults("hang@3:1") == (Fault("hang", 3, 1),)
    assert parse_faults(None) == () and parse_faults("") == ()
    assert Fault("spike", 12, 1).name == "spike@12:1" and Fault("nan", 5).name == "nan@5"
    assert Fault("nan", 5).hits(3) and Fault("nan", 5, 1).hits(1) and not Fault("nan", 5, 1).hits(0)
    assert parse_faults("slow@1:3,hang@4:1") == (Fault("slow", 1, 1, 3.0), Fault("hang", 4, 1))
    assert Fault("slow", 1, 1, 2.5).name == "slow@1:2.5" and parse_faults("slow@0:1.5") == (Fault("slow", 1, 0, 1.5),)


@pytest.mark.parametrize(
    "text",
    [
        "nan",
        "nan@",
        "nan@0",
        "boom@3",
        "nan@3,nan@3",
        "nan@3;spike@4",
        "nan@-1",
        "spike@2:x",
        "slow@1",
        "slow@1:1",
        "slow@1:0.5",
        "slow@x:2",
        "slow@1:2,slow@1:2",
    ],
)
def test_bad_faults_do_not_parse(text: str) -> None:
    assert parse_faults(text) is None


def test_a_bad_drill_is_one_line_naming_the_option_and_the_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLM_INJECT_FAULT", "nan5")
    with pytest.raises(ConfigError) as raised:
        load_config([])
    message = str(raised.value)
    assert (
        message.startswith("MLM_INJECT_FAULT='nan5': expected nan@STEP, spike@STEP or hang@STEP")
        and "\n" not in message
    )
    assert raised.value.exit_code == 2


def test_a_drill_is_refused_with_a_hub_push() -> None:
    with pytest.raises(ConfigError, match=r"--inject_fault='nan@3': expected unset with push_to_hub"):
        load_config(["--inject_fault", "nan@3", "--push_to_hub", "true", "--hub_model_id", "me/model"])


def test_the_defaults_roll_back_three_times_and_derive_the_hang_bound() -> None:
    resilience = load_config([]).resilience
    assert (resilience.spike_rollbacks, resilience.inject_fault, resilience.hang_timeout) == (3, None, 0)


def test_a_hang_bound_under_ten_seconds_is_one_line_naming_the_option() -> None:
    with pytest.raises(ConfigError, match=r"^--hang_timeout=5: expected 0 \(derived\) or at least 10"):
        load_config(["--hang_timeout", "5"])
    assert load_config(["--hang_timeout", "10"]).resilience.hang_timeout == 10
