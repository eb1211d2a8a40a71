"""transformers' run_mlm.py ``group_texts``, shared by its recipe (bench/run_mlm.py) and the preprocessing
benchmark (bench/data.py); here because it imports nothing heavy (bench/data.py measures its processes' memory)."""

from __future__ import annotations

import itertools


def group_texts(examples: dict[str, list[list[int]]], block: int) -> dict[str, list[list[int]]]:
    """Concatenate a map batch's rows and cut them into ``block``-token rows, the batch's remainder dropped (a
    batch shorter than one block stays one short row), as run_mlm.py does."""
    concatenated = {k: list(itertools.chain(*examples[k])) for k in examples}
    total = len(concatenated[next(iter(examples))])
    if total >= block:
        total = (total // block) * block
    return {k: [t[i : i + block] for i in range(0, total, block)] for k, t in concatenated.items()}
