"""Several tokenized corpora mixed into one training set by their share of the training tokens
(train/common/mixture.py parses the option).

What the libraries lack: ``datasets.interleave_datasets`` samples *examples* by probability, so its shares hold only
in expectation and count examples, not tokens; ours are counts, fixed by the seed, of whole examples:

- Each source is read, tokenized (and packed) alone, so the mixing never splits a document or packs two sources
  into one block; a source's examples are weighed by their mean real tokens (every packed block weighs the same).
- An epoch takes ``count_i`` examples of source i, so that the token shares are the weights. Its length follows
  ``mixture_exhausted``: ``repeat`` (the default) ends the epoch once every source has been read whole, a source
  short of its share read again (in another order); ``stop`` ends it when the first source has been read whole,
  the others contributing the part of them that their weight asks for (the same part in every epoch).
- Which examples, and the order of a source's repeats, are drawn from the seed: a rerun, or a resume on any number
  of ranks, rebuilds the same mixed set, and the Trainer's own sampler shuffles and resumes it as it does one
  corpus. The shares are exact over the epoch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, concatenate_datasets

from train.common.console import warn
from train.common.distributed import is_world_zero
from train.common.mixture import Part
from train.data.tokenization import IndexedExamples

RULES = ("repeat", "stop")
MANY_READS = 10  # a source read this many times an epoch is said: its weight is far above its size


@dataclass(frozen=True)
class MixedSource:
    """What the epoch takes of one source (run.json's ``mixture``, the banner's line)."""

    key: str
    name: str
    weight: float  # the share of tokens asked for
    share: float  # the share of the epoch's real tokens it has
    examples: int  # examples the source holds
    taken: int  # examples the epoch takes from it (repeats counted)
    tokens: int  # the real tokens of those

    @property
    def reads(self) -> float:
        """How many times the epoch reads the source (below 1: a part of it)."""
        return self.taken / max(self.examples, 1)


def mix(
    parts: list[tuple[Part, IndexedExamples]], rule: str, seed: int, pad_token_id: int
) -> tuple[Dataset, list[MixedSource]]:
    """The training set of a mixture and what it took of each source."""
    tokens = [row_tokens(examples.examples, pad_token_id) for _, examples in parts]
    counts = example_counts([part.weight for part, _ in parts], tokens, rule)
    chosen, facts = [], []
    for index, ((part, examples), count, row) in enumerate(zip(parts, counts, tokens, strict=True)):
        picks = draw(len(examples), count, seed, index)
        chosen.append(examples.examples.select(picks))
        facts.append(MixedSource(part.key, part.name, part.weight, 0.0, len(examples), count, int(row[picks].sum())))
    total = sum(fact.tokens for fact in facts) or 1
    facts = [dataclasses.replace(fact, share=fact.tokens / total) for fact in facts]
    if is_world_zero():
        for fact in facts:
            if fact.reads >= MANY_READS:
                warn(
                    f"mixture: {fact.key} ({fact.name}) is read {fact.reads:.0f} times an epoch to make its "
                    f"{fact.weight:.0%} of the tokens; a smaller weight or more of its text would repeat it less"
                )
    return concatenate_datasets(chosen), facts


def example_counts(weights: list[float], tokens: list[np.ndarray], rule: str) -> list[int]:
    """The examples an epoch takes of each source so that their real tokens have the ``weights``' shares."""
    means = [float(row.mean()) if len(row) else 0.0 for row in tokens]
    shares = [w / m if m > 0 else 0.0 for w, m in zip(weights, means, strict=True)]  # of examples, not tokens
    norm = sum(shares)
    shares = [s / norm for s in shares]
    lengths = [len(row) / s for row, s in zip(tokens, shares, strict=True) if s > 0]
    epoch = max(lengths) if rule == "repeat" else min(lengths)
    return [max(1, round(epoch * share)) for share in shares]


def draw(examples: int, count: int, seed: int, source: int) -> np.ndarray:
    """``count`` of ``examples`` indices: whole shuffled passes, then a shuffled part (a pass never repeats an
    example before it has taken all), from the seed and the source's place in the mixture."""
    rng = np.random.default_rng([seed, source])
    passes = [rng.permutation(examples) for _ in range(math.ceil(count / examples))]
    return np.concatenate(passes)[:count] if passes else np.zeros(0, dtype=np.int64)


def row_tokens(examples: Dataset, pad_token_id: int) -> np.ndarray:
    """Each example's real (non-padding) tokens, counted by Arrow and numpy rather than per example in Python: its
    length, unless padding was stored (max_length), when the padding is counted out row by row."""
    column = examples.with_format("arrow")[:].column("input_ids")  # the split's own table: no copy
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    if not pc.any(pc.equal(pc.list_flatten(column), pad_token_id)).as_py():  # packed or dynamic: nothing padded
        return lengths
    ids = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = ids.offsets.to_numpy()
    real = np.concatenate([[0], np.cumsum(ids.values.to_numpy(zero_copy_only=False) != pad_token_id)])
    return real[offsets[1:]] - real[offsets[:-1]]


def mixture_text(records: list[dict[str, Any]], rule: str) -> str:
    """The banner's words (of :func:`as_record`'s records): each source's share of the tokens, asked and had, and
    how much of it an epoch reads."""
    parts = [
        f"{r['key']} {r['share']:.1%} of the tokens (asked {r['weight']:.1%}; {r['taken']:,} of {r['examples']:,} "
        f"examples, read {r['reads']:.2g}x)"
        for r in records
    ]
    ends = "every source is read whole" if rule == "repeat" else "the first source is read whole"
    return f"{len(records)} sources: {'; '.join(parts)}; an epoch ends when {ends} (mixture_exhausted={rule})"


def as_record(facts: list[MixedSource]) -> list[dict[str, Any]]:
    """run.json's ``mixture`` and the banner's record."""
    return [{**dataclasses.asdict(fact), "reads": round(fact.reads, 4)} for fact in facts]
