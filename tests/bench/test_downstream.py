"""bench/downstream.py's pure parts: the text it keeps, the task's split (no test line in the domain text), the
verdict's words."""

from __future__ import annotations

import pytest

from bench.downstream import (
    ARCHITECTURE,
    CLASSES,
    PER_CLASS,
    TEST_PER_CLASS,
    man_text,
    split_task,
    variant,
    verdict,
    words_line,
)


def test_prose_is_kept_and_troff_is_not() -> None:
    assert man_text(r"The \fBls\fR command lists the \fIfiles\fP of a directory.") == (
        "The ls command lists the files of a directory."
    )
    assert man_text(".TH LS 1") is None and man_text('\\" a comment with six words or more') is None
    assert words_line("too short a line") is None and words_line("1 2 3 4 5 6 7 8") is None


def test_the_task_is_three_licences_and_no_test_line_is_in_the_domain_text() -> None:
    train, test, domain = split_task(per_class=10)
    assert len(train) == 10 * len(CLASSES) and len(test) == TEST_PER_CLASS * len(CLASSES)
    assert {row["label"] for row in train} == set(CLASSES) == {row["label"] for row in test}
    tested = {row["text"] for row in test}
    assert not tested & set(domain) and not tested & {row["text"] for row in train}
    assert {row["text"] for row in train} <= set(domain)  # the training lines are domain text, unlabelled


def row(accuracy: float, std: float) -> dict:
    return {"accuracy": accuracy, "accuracy_std": std}


@pytest.mark.parametrize(
    ("starting", "expected"),
    [
        (0.40, "higher than the starting model (+0.100"),
        (0.48, "within the seeds' spread of the starting model (+0.020"),
    ],
)
def test_the_verdict_weighs_the_gap_against_the_seeds_spread(starting: float, expected: str) -> None:
    text = verdict({"continued": row(0.5, 0.03), "starting": row(starting, 0.02), "random init": row(0.55, 0.01)})
    assert expected in text and "lower than the random init model (-0.050" in text


def test_a_run_other_than_the_default_is_named_apart() -> None:
    assert variant(ARCHITECTURE, PER_CLASS) == ""
    assert variant("n_layers=4,n_heads=4,dim=256,hidden_dim=1024", PER_CLASS) == "-4x256"
    assert variant(ARCHITECTURE, 80) == "-80-per-class"
