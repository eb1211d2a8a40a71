"""MLM masking as a pure function of (seed, epoch, sample index), and padding per batch.

The stock ``DataCollatorForLanguageModeling`` draws masks from the global RNG. The dataloader collates one batch
ahead of the step being trained, so the RNG state a checkpoint saves is one collate out of step with the masks,
and a resumed run diverges from an uninterrupted one. Here every sample's masks come from a generator seeded by
(seed, epoch, sample index): no random state has to survive a checkpoint, and a sample is masked the same way
whichever rank, batch or worker process collates it. The epoch changes the masks between epochs (dynamic
masking, as RoBERTa does).

Whole-word masking follows transformers' collator: each word is chosen with ``mlm_probability`` (drawn at its
first token) and then all its tokens are masked; which tokens start words comes from the tokenizer's vocabulary
(train/model/words.py), since packed blocks keep no offsets. A block that starts inside a word takes that fragment as
a word of its own.

A mask rate that changes during training (``final_mlm_probability``: Ankner et al. 2023, 30 % -> 15 %): the masks
depend on the step being trained, which the collator, a batch ahead and perhaps in a worker process, cannot know.
So the collator masks at the schedule's highest rate and hands each masked position its draw (``MASK_DRAW``); the
Trainer, which knows the step, keeps the masks whose draw is under the step's rate (:func:`thin_masks`) before the
batch's masked tokens are counted. A kept mask is what masking at that rate would have drawn: each token is chosen
with the rate, and the 80/10/10 replacement is the same given that it was.

Documents kept apart (``isolate``, train/model/packing.py): a packed block's ``document_lengths``, or with ``flatten``
(padding-free) each example of the batch, become per-token document ids, from which the model gets position ids
restarting at every document and block-diagonal attention. Flattened, the batch is one row of all its examples'
tokens, masked each by its own sample index first, with no padding at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from train.data import DOCUMENT_LENGTHS, SAMPLE_INDEX

IGNORE_INDEX = -100
MASK_DRAW = "mask_draw"  # a batch's per-position draws (mask_draws): 1.0 where nothing is masked


@dataclass
class MaskingCollator:
    """Pads a batch and masks it: of ``mlm_probability`` of the tokens, ``mask_replace_prob`` become the mask token,
    ``random_replace_prob`` a random token, the rest stay unchanged (80/10/10 by default, as BERT and
    transformers' collator do)."""

    pad_token_id: int
    mask_token_id: int
    vocab_size: int
    mlm_probability: float = 0.15
    seed: int = 42
    pad_to_multiple_of: int | None = 8
    epoch: int = field(default=0)
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1
    word_start: np.ndarray | None = field(default=None, repr=False)  # per token id: starts a word (whole words)
    # (input_ids, document_ids) -> the model's inputs keeping documents apart (train/model/packing.py's isolated_inputs)
    isolate: Callable[[torch.Tensor, torch.Tensor], dict[str, Any]] | None = field(default=None, repr=False)
    flatten: bool = False  # padding-free: the batch as one row, one document per example (needs isolate)
    mask_draws: bool = False  # each batch carries its masks' draws, for a rate schedule (thin_masks)

    def for_evaluation(self, mlm_probability: float | None) -> MaskingCollator:
        """The same collator masking at ``mlm_probability`` (the evaluation rate), with no draws; itself when that is
        None and it hands none. Its epoch stays 0: every evaluation masks the same positions, so evaluations
        compare."""
        if mlm_probability is None and not self.mask_draws:
            return self
        rate = self.mlm_probability if mlm_probability is None else mlm_probability
        return replace(self, mlm_probability=rate, epoch=0, mask_draws=False)

    def _masks(self, index: int, tokens: np.ndarray, special: np.ndarray) -> tuple[np.ndarray, ...]:
        """The sample's tokens as masked, its labels, and each position's draw (1.0 where not masked)."""
        rng = np.random.default_rng([self.seed, self.epoch, index])
        draws = rng.random((tokens.shape[0],))
        if self.word_start is not None:
            draws = self._whole_words(draws, tokens, special)
        chosen = (draws < self.mlm_probability) & ~special
        labels = np.where(chosen, tokens, IGNORE_INDEX)
        roll = rng.random(tokens.shape[0])
        replaced = tokens.copy()
        replaced[chosen & (roll < self.mask_replace_prob)] = self.mask_token_id
        randomised = (
            chosen & (roll >= self.mask_replace_prob) & (roll < self.mask_replace_prob + self.random_replace_prob)
        )
        replaced[randomised] = rng.integers(0, self.vocab_size, size=int(randomised.sum()))
        return replaced, labels, np.where(chosen, draws, 1.0).astype(np.float32)

    def _whole_words(self, draws: np.ndarray, tokens: np.ndarray, special: np.ndarray) -> np.ndarray:
        """Each word's draw at its first token, spread over the word: a word starts at a token the vocabulary
        marks as a word start, or after a special (or padding) token."""
        assert self.word_start is not None
        after_special = np.concatenate(([True], special[:-1]))
        starts = ~special & (self.word_start[tokens] | after_special)
        word = np.cumsum(starts)  # each token's word number; 0 only before the first word (special tokens)
        return np.concatenate(([1.0], draws[starts]))[word]

    def measure(self, batches: list[list[dict[str, Any]]]) -> dict[str, float | None]:
        """Over these batches: the share of real (non-padding) tokens masked (``realised``: what
        ``mlm_probability`` comes to after special tokens, never masked, and whole words' lengths) and of the
        positions computed that are real tokens (``efficiency``: padding lowers it; a flattened batch has none)."""
        plain = replace(self, isolate=None, flatten=False)
        real = masked = positions = 0
        for features in batches:
            batch = plain(features)
            present = int(batch["attention_mask"].sum())
            real += present
            masked += int((batch["labels"] != IGNORE_INDEX).sum())
            positions += present if self.flatten else batch["attention_mask"].numel()
        return {
            "realised": masked / real if real else None,
            "efficiency": real / positions if positions else None,
        }

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if self.flatten:
            features = [self._flattened(features)]
        longest = max(len(f["input_ids"]) for f in features)
        if self.pad_to_multiple_of and not self.flatten:
            longest = -(-longest // self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch = len(features)
        input_ids = np.full((batch, longest), self.pad_token_id, dtype=np.int64)
        labels = np.full((batch, longest), IGNORE_INDEX, dtype=np.int64)
        attention = np.zeros((batch, longest), dtype=np.int64)
        draws = np.ones((batch, longest), dtype=np.float32)
        documents = np.full((batch, longest), -1, dtype=np.int64)  # packing.PADDING
        for row, feature in enumerate(features):
            tokens = np.asarray(feature["input_ids"], dtype=np.int64)
            real = (
                np.asarray(feature["attention_mask"], dtype=bool)
                if "attention_mask" in feature
                else np.ones(tokens.shape[0], dtype=bool)
            )
            if "labels" in feature:  # flattened: masked example by example already
                masked, target, drawn = tokens, np.asarray(feature["labels"], dtype=np.int64), feature[MASK_DRAW]
            else:
                special = np.asarray(feature["special_tokens_mask"], dtype=bool) | ~real
                masked, target, drawn = self._masks(int(feature[SAMPLE_INDEX]), tokens, special)
            input_ids[row, : tokens.shape[0]] = masked
            labels[row, : tokens.shape[0]] = target
            draws[row, : tokens.shape[0]] = drawn
            attention[row, : tokens.shape[0]] = real
            if self.isolate is not None:
                lengths = feature.get(DOCUMENT_LENGTHS) or [tokens.shape[0]]
                documents[row, : sum(lengths)] = np.repeat(np.arange(len(lengths)), lengths)
        out = {"input_ids": torch.from_numpy(input_ids), "labels": torch.from_numpy(labels)}
        if self.mask_draws:
            out[MASK_DRAW] = torch.from_numpy(draws)
        if self.isolate is None:
            return {**out, "attention_mask": torch.from_numpy(attention)}
        documents[attention == 0] = -1
        return {**self.isolate(out.pop("input_ids"), torch.from_numpy(documents)), **out}

    def _flattened(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        """The examples of a batch, each masked by its own sample index, laid end to end in one row."""
        tokens, targets, draws = [], [], []
        for feature in features:
            ids = np.asarray(feature["input_ids"], dtype=np.int64)
            masked, target, drawn = self._masks(
                int(feature[SAMPLE_INDEX]), ids, np.asarray(feature["special_tokens_mask"], dtype=bool)
            )
            tokens.append(masked)
            targets.append(target)
            draws.append(drawn)
        return {
            "input_ids": np.concatenate(tokens),
            "labels": np.concatenate(targets),
            MASK_DRAW: np.concatenate(draws),
            DOCUMENT_LENGTHS: [len(t) for t in tokens],
        }


def evaluation_rate(training: float, final: float | None, evaluation: float | None) -> float | None:
    """Evaluation's own mask rate: ``evaluation`` when set; with a rate schedule (``final``) the training's first
    rate, since the collator's own is the schedule's highest; else None (training's collator as it is)."""
    if evaluation is not None:
        return evaluation
    return training if final is not None else None


def thin_masks(batch: dict[str, Any], rate: float) -> dict[str, Any]:
    """A batch masked at a schedule's highest rate (``mask_draws``) as masked at ``rate``: the masks whose draw is
    under it stay, the others get their token back and no label; the draws leave the batch (the model takes no
    such input)."""
    batch = dict(batch)
    draws = batch.pop(MASK_DRAW)
    labels = batch["labels"]
    dropped = (draws >= rate) & (labels != IGNORE_INDEX)
    batch["input_ids"] = torch.where(dropped, labels, batch["input_ids"])
    batch["labels"] = labels.masked_fill(dropped, IGNORE_INDEX)
    return batch


def first_rows(batch: dict[str, Any], rows: int) -> dict[str, Any]:
    """A collated batch's first ``rows`` rows, every layout the collator makes: each tensor whose first dimension
    is the batch's rows (ids, labels, draws, positions, a 2D or 4D attention mask, ModernBERT's dict of masks), and
    the flash-attention varlen kwargs (document boundaries over the flattened rows: train/model/packing.py), cut at
    the last kept row's end. A batch warm-up's step (train/common/schedules.py BatchWarmup) trains these; the
    collator, a batch ahead and perhaps in a worker process, cannot know the step. A padding-free batch is one row:
    the job refuses a batch warm-up there (train/run/batches.py check_batch_warmup)."""
    size = batch["input_ids"].shape[0]
    if rows >= size:
        return batch
    length = batch["input_ids"].shape[1]

    def cut(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: cut(item) for key, item in value.items()}
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == size:
            return value[:rows]
        return value

    kept = {key: cut(value) for key, value in batch.items()}
    if "cu_seq_lens_q" in batch:
        boundaries = batch["cu_seq_lens_q"]
        boundaries = boundaries[boundaries <= rows * length]  # each row starts a segment: its end is a boundary
        longest = int(boundaries.diff().max())
        kept.update(cu_seq_lens_q=boundaries, cu_seq_lens_k=boundaries, max_length_q=longest, max_length_k=longest)
    return kept
