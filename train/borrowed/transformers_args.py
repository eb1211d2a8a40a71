"""What we borrow from transformers' argument parser (transformers 5.25, ``transformers/hf_argparser.py``)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from transformers import HfArgumentParser

from train.borrowed.touch import borrows


class FieldHookParser(HfArgumentParser):
    """HfArgumentParser that hands each dataclass field to :meth:`argparse_field` before turning it into a flag."""

    @classmethod
    @borrows("transformers", "5.25", "hf_argparser.py HfArgumentParser._parse_dataclass_field")
    def _parse_dataclass_field(cls, parser: argparse.ArgumentParser, field: dataclasses.Field[Any]) -> None:
        """HfArgumentParser turns each field into ``add_argument`` here (transformers 5.25, ``hf_argparser.py``,
        the static method ``HfArgumentParser._parse_dataclass_field(parser, field)``, called by
        ``_add_dataclass_arguments`` as ``self._parse_dataclass_field``), passing every metadata key on: the
        schema keeps a key of its own there (a field's bounds) that ``add_argument`` refuses. No public option
        filters a field's metadata."""
        HfArgumentParser._parse_dataclass_field(parser, cls.argparse_field(field))

    @staticmethod
    def argparse_field(field: dataclasses.Field[Any]) -> dataclasses.Field[Any]:
        """Hook: the field as HfArgumentParser should see it (the field itself by default)."""
        return field
