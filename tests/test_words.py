"""Where words start, from each tokenizer kind's vocabulary: WordPiece's ##, byte-level BPE's Ġ, SentencePiece's ▁;
a tokenizer that says nothing about words is refused for whole-word masking."""

from __future__ import annotations

import pytest

from tests.helpers import demo_config
from train.common.errors import ConfigError
from train.data import load_raw
from train.model.tokenizer_training import BPE, UNIGRAM, WORDPIECE, train_tokenizer
from train.model.words import word_starts

TEXT = "training demonstration sample"  # words of the demo text, in pieces at a 45-token vocabulary


@pytest.mark.parametrize("kind", [WORDPIECE, BPE, UNIGRAM])
def test_each_kind_marks_the_first_piece_of_every_word(kind) -> None:
    config = demo_config(demo_samples="50", tokenizer_vocab_size="45")
    tokenizer = train_tokenizer(load_raw(config.data, config.training), config.model, config.data, kind)
    starts = word_starts(tokenizer, "MLM_TOKENIZER_NAME")
    assert starts.shape == (len(tokenizer),)
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert len(ids) > 3
    # Words are counted by their first pieces; the first word of a text has no space before it for BPE, whose
    # collator counts it as a word because a special token (or the row's start) precedes it.
    counted = int(starts[ids].sum()) + (0 if starts[ids[0]] else 1)
    assert counted == len(TEXT.split())


def test_a_tokenizer_without_word_markers_is_refused() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    bare = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2, "[MASK]": 3}, unk_token="[UNK]"))
    bare.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bare, unk_token="[UNK]", mask_token="[MASK]")
    with pytest.raises(ConfigError, match=r"whole_word_mask: the tokenizer of MLM_TOKENIZER_NAME \(WordLevel"):
        word_starts(tokenizer, "MLM_TOKENIZER_NAME")
