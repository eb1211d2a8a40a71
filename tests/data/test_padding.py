"""train.data.padding: the padding modes as one enum, each group and rule asked of it."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from train.config import DataArguments
from train.data import Padding

P = Padding


def test_the_enum_is_the_options_values():
    field = next(f for f in dataclasses.fields(DataArguments) if f.name == "padding")
    declared = typing.get_args(typing.get_type_hints(DataArguments)["padding"])
    assert [mode.value for mode in Padding] == list(declared)
    assert Padding(field.default) is P.DYNAMIC
    with pytest.raises(ValueError):
        Padding("packing")


def test_groups():
    assert {m for m in Padding if m.packs} == {P.PACKED, P.PACKED_CROSSING}
    assert {m for m in Padding if m.isolates} == {P.PACKED, P.PADDING_FREE}
    assert {m for m in Padding if m.pads_when_tokenized} == {P.MAX_LENGTH}
    assert {m for m in Padding if m.flattens} == {P.PADDING_FREE}
    assert {m for m in Padding if m.rounds_lengths} == {P.DYNAMIC}


@pytest.mark.parametrize("mode", list(Padding))
def test_the_pad_multiple_applies_to_dynamic_padding_only(mode):
    # the value the launcher decided (train/launch/decide.py), used by the collator only where the mode rounds
    assert mode.pad_multiple(8) == (8 if mode is P.DYNAMIC else None)


def test_a_mode_is_its_options_string():
    assert P.PACKED == "packed" and f"{P.PADDING_FREE}" == "padding_free" and str(P.MAX_LENGTH) == "max_length"
