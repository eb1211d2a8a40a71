"""The corpus as read, before tokenization: what train/data/load.py hands to the tokenizer's training, the
tokenization and the stream. Plain values in a module of their own, so that load, tokenization and stream can all name
them without importing each other in a circle."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from datasets import DatasetDict, IterableDataset

from train.common.mixture import Part


@dataclass(frozen=True)
class TextStream:
    """The training corpus as a stream of ``column`` rows, and the texts held out of it for evaluation. The rows
    are filtered (``keep``) in the same batched step that tokenizes them: every further batched layer of an
    IterableDataset joins its batch's keys into a new string, which cost 70 % of the stream's time with four."""

    rows: IterableDataset
    column: str
    held_out: frozenset[str] = frozenset()

    def keep(self, texts: list[Any]) -> list[str]:
        """The texts to train on: strings (null and non-string rows dropped) not held out for evaluation."""
        return [text for text in texts if isinstance(text, str) and text not in self.held_out]

    def texts(self) -> Iterator[str]:
        for batch in self.rows.iter(batch_size=1000):
            yield from self.keep(batch[self.column])


@dataclass(frozen=True)
class RawData:
    """Train and evaluation text, and a fingerprint naming their content for the caches. For a stream, ``stream``
    is the training corpus and ``splits["train"]`` only its first examples (what a new tokenizer learns from)."""

    splits: DatasetDict
    fingerprint: str
    stream: TextStream | None = None
    # What identifies the data as read (train/data/identity.py): each checkpoint and run.json record it.
    identity: dict[str, dict[str, Any]] = field(default_factory=dict)
    # A mixture's sources, each read alone (``splits`` is then their concatenation: what a new tokenizer learns
    # from); train/data/mixture.py mixes them once tokenized.
    parts: tuple[tuple[Part, RawData], ...] | None = None
