"""Tokenizers trained from scratch by family: the kind the model type's family uses, its special tokens and
sequence template, a cache per kind; MLM_TOKENIZER_TYPE overrides."""

from __future__ import annotations

import pytest

from tests.helpers import demo_config
from train.common.errors import ConfigError
from train.data import DEMO_SENTENCE, load_raw
from train.model.tokenizer_training import BPE, UNIGRAM, WORDPIECE, tokenizer_kind, train_tokenizer

TEXT = DEMO_SENTENCE  # the demo corpus is this sentence: every piece of it is in the vocabulary


@pytest.mark.parametrize(
    ("model_type", "kind"),
    [("bert", WORDPIECE), ("distilbert", WORDPIECE), ("electra", WORDPIECE), ("roberta", BPE), ("modernbert", BPE),
     ("albert", UNIGRAM), ("deberta-v2", UNIGRAM), ("xlm-roberta", UNIGRAM), (None, WORDPIECE)],
)  # fmt: skip
def test_the_family_picks_the_kind(model_type: str | None, kind: object) -> None:
    assert tokenizer_kind(demo_config().model.tokenizer_type, model_type) is kind


def test_the_option_overrides_the_family() -> None:
    assert tokenizer_kind(demo_config(tokenizer_type="unigram").model.tokenizer_type, "bert") is UNIGRAM
    with pytest.raises(ConfigError, match="MLM_TOKENIZER_TYPE='sentencepiece': expected one of auto, wordpiece"):
        demo_config(tokenizer_type="sentencepiece")


@pytest.mark.parametrize(("kind", "start", "end", "mask"), [(WORDPIECE, "[CLS]", "[SEP]", "[MASK]"),
                                                            (BPE, "<s>", "</s>", "<mask>"),
                                                            (UNIGRAM, "[CLS]", "[SEP]", "[MASK]")])  # fmt: skip
def test_each_kind_has_its_familys_tokens_and_template(kind, start: str, end: str, mask: str) -> None:
    config = demo_config()
    tokenizer = train_tokenizer(load_raw(config.data, config.training), config.model, config.data, kind)
    ids = tokenizer(TEXT)["input_ids"]
    assert tokenizer.convert_ids_to_tokens([ids[0], ids[-1]]) == [start, end]
    assert tokenizer.mask_token == mask and tokenizer.pad_token_id is not None and tokenizer.unk_token is not None
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    assert decoded.replace(" ", "").lower() == TEXT.replace(" ", "").lower()  # WordPiece spaces out "multi - gpu"
    again = train_tokenizer(
        load_raw(config.data, config.training), config.model, config.data, kind
    )  # from the cache, one directory per kind
    assert again.get_vocab() == tokenizer.get_vocab()
    if kind is BPE:
        assert tokenizer.pad_token_id == 1  # RoBERTa's order: position ids start after the padding id
