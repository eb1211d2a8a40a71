"""Bounds: the check and its words, said once in the error and once in the help."""

from __future__ import annotations

import pytest

from train.config import SHOWN_CHARS, Bound, help_with, shown
from train.config.bounds import LOCAL_RANKS, OVERRIDES, PROCESSES, integers, non_blank, steps


def test_help_ends_with_the_bounds_words() -> None:
    bound = integers(1, 4)
    assert help_with("Workers.", bound) == "Workers. Accepts an integer from 1 to 4."
    assert help_with("Workers ", bound) == "Workers. Accepts an integer from 1 to 4."  # a sentence either way
    assert help_with("Workers.", None) == "Workers."
    assert help_with("A name.", non_blank("a name")) == "A name."


@pytest.mark.parametrize(
    ("bound", "good", "bad", "words"),
    [
        (integers(1), [1, 2**40], [0, -1], "a positive integer"),
        (integers(0, note=" (0: none)"), [0], [-1], "an integer >= 0 (0: none)"),
        (integers(8, 16), [8, 16], [7, 17], "an integer from 8 to 16"),
        (steps(), [0.5, 1, 10.0], [0, 2.5, -1, 1e30], "a whole number of steps, or a fraction in (0, 1) of the"),
        (steps(zero=True), [0, 0.5, 3], [-0.1, 1.5], "a whole number of steps, or a fraction in [0, 1) of the"),
    ],
)
def test_numeric_bounds(bound: Bound, good: list, bad: list, words: str) -> None:
    assert all(bound.accepts(v) for v in good) and not any(bound.accepts(v) for v in bad)
    assert bound.expected.startswith(words)


@pytest.mark.parametrize(
    ("bound", "good", "bad"),
    [
        (PROCESSES, ["1", "1024", " 8 ", "auto", "GPU", "cpu"], ["0", "1025", "", "²", "٣", "-1", "many"]),
        (LOCAL_RANKS, ["0", "0,1", "0, 1", "all", "1023"], ["", "0,0", "-1", "0,,1", "1024", "a"]),
        (OVERRIDES, ["", "a=1", "n_layers=2,dim=128"], ["a", "a=1,", "a=1=2", "a=1, b=2", "a=1,a=2", "1a=2"]),
    ],
)
def test_word_bounds(bound: Bound, good: list, bad: list) -> None:
    assert [v for v in good if not bound.accepts(v)] == []
    assert [v for v in bad if bound.accepts(v)] == []


def test_a_value_is_echoed_at_most_shown_chars_long() -> None:
    assert shown("abc") == "'abc'"
    long = shown("x" * 500)
    assert long.endswith("…") and len(long) == SHOWN_CHARS + 1
