"""tools/upgrade_check.py's pure parts: which pins it lifts, what it reports as moved, how it reads pytest's report."""

from __future__ import annotations

from pathlib import Path

from tools import upgrade_check


def test_the_stack_pins_are_lifted_and_the_other_pins_stay(tmp_path: Path):
    wanted = tmp_path / "requirements.in"
    wanted.write_text(
        "-c requirements.lock\ntorch==2.15.0\nTransformers==5.25.0\ns3fs==2026.9.0  # lockstep\npyarrow<26\n"
    )
    assert upgrade_check.unpinned_requirements(wanted).splitlines() == [
        "torch",
        "Transformers",
        "s3fs==2026.9.0  # lockstep",
        "pyarrow<26",
    ]


def test_only_the_stack_that_moved_is_reported():
    locked = {"torch": "2.15.0", "transformers": "5.25.0", "pyyaml": "6.0"}
    now = {"torch": "2.16.0", "transformers": "5.25.0", "pyyaml": "7.0"}
    assert upgrade_check.moved(locked, now) == ["torch 2.15.0 -> 2.16.0"]


def test_a_failed_canary_is_reported_by_its_touch(tmp_path: Path, capsys):
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite><testcase classname="tests.borrowed.test_canaries" name="test_touch[trainer._save]">'
        '<failure message="trainer._save (transformers 5.25.0): Trainer._save lost its state_dict parameter&#10;more">'
        "trace</failure></testcase>"
        '<testcase classname="tests.borrowed.test_canaries" name="test_touch[dataset._fingerprint]"/>'
        "</testsuite></testsuites>"
    )
    broken = upgrade_check.failures(junit, "touch")
    assert broken == [
        upgrade_check.Broken(
            "touch",
            "borrowed.test_canaries::test_touch[trainer._save]",
            "trainer._save (transformers 5.25.0): Trainer._save lost its state_dict parameter",
        )
    ]
    assert upgrade_check.report(["transformers 5.25.0 -> 5.26.0"], broken) == 1
    out = capsys.readouterr().out
    assert "private touch: borrowed.test_canaries::test_touch[trainer._save]" in out
    assert upgrade_check.report([], []) == 0


def test_no_report_is_a_failure_not_a_pass(tmp_path: Path):
    assert [b.name for b in upgrade_check.failures(tmp_path / "missing.xml", "fast")] == ["pytest"]
