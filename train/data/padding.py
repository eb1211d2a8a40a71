"""The padding modes (``MLM_PADDING``, declared in train/config/schema.py) as one enum that owns their groups and
rules: every place that asks what a mode does asks it here, never compares the option's string.

- ``dynamic``: examples cut to max_seq_length and left unpadded; the collator pads each batch to its longest,
  rounded up to ``pad_to_multiple_of``.
- ``max_length``: every example padded to max_seq_length when tokenized (the seed's way).
- ``packed``: examples concatenated and cut into full max_seq_length blocks (run_mlm.py's group_texts), each block
  with its documents' lengths, each document attending to itself only, its positions restarting
  (train/model/packing.py).
- ``packed_crossing``: the same blocks, attention across documents.
- ``padding_free``: examples as ``dynamic`` leaves them; the collator lays a batch out end to end in one row, its
  examples kept apart as ``packed`` keeps a block's documents, with no padding at all.

The pad multiple is two decisions, made in two places on purpose. The launcher decides the *value* from the
hardware (train/launch/decide.py ``decide_pad_multiple``: 1 on a CPU, which has no tensor cores, unless the user
chose); it does not ask the mode, so the plan and the ranks' options say the same for every mode, and the
value stays a plain option. Whether the value is *used* depends only on the mode, and that rule is here
(:meth:`Padding.pad_multiple`): only ``dynamic`` pads a batch to a length it chooses; the others' lengths are
max_seq_length (``max_length``, packed blocks) or exactly the batch's tokens (``padding_free``).
"""

from __future__ import annotations

from enum import StrEnum


class Padding(StrEnum):
    """A padding mode; its value is the option's (``Padding(config.data.padding)``)."""

    DYNAMIC = "dynamic"
    MAX_LENGTH = "max_length"
    PACKED = "packed"
    PACKED_CROSSING = "packed_crossing"
    PADDING_FREE = "padding_free"

    @property
    def packs(self) -> bool:
        """Whether examples are concatenated and cut into full max_seq_length blocks (tokenized whole, then
        grouped: train/data/tokenization.py ``group_texts``)."""
        return self in (Padding.PACKED, Padding.PACKED_CROSSING)

    @property
    def isolates(self) -> bool:
        """Whether the documents sharing a row are kept apart: block-diagonal attention and positions restarting
        per document (train/model/packing.py), which the model must support."""
        return self in (Padding.PACKED, Padding.PADDING_FREE)

    @property
    def pads_when_tokenized(self) -> bool:
        """Whether every example is padded to max_seq_length (with its attention mask) when tokenized, not by the
        collator."""
        return self is Padding.MAX_LENGTH

    @property
    def flattens(self) -> bool:
        """Whether the collator lays a batch out as one row of its examples, without padding (padding-free)."""
        return self is Padding.PADDING_FREE

    @property
    def rounds_lengths(self) -> bool:
        """Whether ``pad_to_multiple_of`` applies: only dynamic padding chooses a batch's length."""
        return self is Padding.DYNAMIC

    def pad_multiple(self, configured: int) -> int | None:
        """The collator's ``pad_to_multiple_of``: the configured one where it applies, else None (no rounding)."""
        return configured if self.rounds_lengths else None
