"""Mixing tokenized corpora by their share of the tokens (train/data/mixture.py): the counts, the draw from the
seed, the epoch's two rules, and a mixture read end to end by load_raw and build_corpus."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset
from transformers import PreTrainedTokenizerFast

from tests.data.helpers import config_for
from train.common.errors import ConfigError
from train.common.mixture import mixture_parts
from train.data import load_raw
from train.data.corpus import build_corpus
from train.data.mixture import draw, example_counts, mix, mixture_text, row_tokens
from train.data.tokenization import IndexedExamples


def examples(lengths: list[int], pad: int = 0, padded_to: int | None = None) -> IndexedExamples:
    rows = [[5] * n + [pad] * ((padded_to or n) - n) for n in lengths]
    return IndexedExamples(Dataset.from_dict({"input_ids": rows}))


def test_real_tokens_per_example_leave_the_padding_out() -> None:
    assert row_tokens(examples([3, 1, 4], padded_to=4).examples, pad_token_id=0).tolist() == [3, 1, 4]


@pytest.mark.parametrize("rule", ["repeat", "stop"])
def test_the_token_shares_are_the_weights_whatever_the_example_lengths(rule: str) -> None:
    """A source of short examples needs more of them for its share of the tokens."""
    short, long = examples([10] * 300), examples([40] * 100)
    parts = list(zip(mixture_parts("short.txt=0.7,long.txt=0.3", "MLM_DATASET") or (), [short, long], strict=True))
    mixed, facts = mix(parts, rule, seed=1, pad_token_id=0)
    assert [f.share for f in facts] == pytest.approx([0.7, 0.3], abs=0.002)  # whole examples: within one's tokens
    assert len(mixed) == sum(f.taken for f in facts)
    reads = [f.reads for f in facts]
    # repeat: the epoch ends once every source was read whole; stop: when the first was
    assert (min(reads) == pytest.approx(1.0)) if rule == "repeat" else (max(reads) == pytest.approx(1.0))
    assert "% of the tokens (asked 70.0%; " in mixture_text([vars(f) | {"reads": f.reads} for f in facts], rule)


def test_the_counts_follow_the_mean_tokens_of_each_source() -> None:
    counts = example_counts([0.5, 0.5], [np.full(100, 10), np.full(100, 20)], "repeat")
    assert counts == [200, 100]  # as many tokens from each: the short source read twice


def test_the_draw_is_the_seeds_and_reads_a_source_whole_before_repeating_it() -> None:
    first = draw(10, 25, seed=7, source=0)
    assert (first == draw(10, 25, seed=7, source=0)).all()
    assert not (first == draw(10, 25, seed=8, source=0)).all() and not (first == draw(10, 25, 7, 1)).all()
    assert sorted(first[:10]) == list(range(10)) and sorted(first[10:20]) == list(range(10))


def test_a_mixture_is_read_tokenized_and_mixed_with_a_held_out_part_per_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name, words in (("news", "the cat sat on a mat"), ("legal", "licence terms grant permission to copy")):
        (tmp_path / f"{name}.txt").write_text("".join(f"{words} {i}\n" for i in range(50)))
    config = config_for(f"{tmp_path}/news.txt=0.25,{tmp_path}/legal.txt=0.75", validation_split_percentage="20")
    raw = load_raw(config.data, config.training)
    assert raw.parts is not None and [p.key for p, _ in raw.parts] == ["news", "legal"]
    assert set(raw.identity) == {"news:news.txt", "legal:legal.txt"}  # each file, by its source
    assert len(raw.splits["train"]) == 80 and len(raw.splits["validation"]) == 20  # what a new tokenizer reads
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=_word_tokenizer(vocab), pad_token="[PAD]", unk_token="[UNK]")
    corpus = build_corpus(config.data, raw, tokenizer, rank=0, world_size=1, seed=config.training.seed)
    assert corpus.validation_parts is not None and {k: len(v) for k, v in corpus.validation_parts.items()} == {
        "news": 10,
        "legal": 10,
    }
    assert corpus.validation is not None and len(corpus.validation) == 20
    assert corpus.mixture is not None and [round(f.share, 2) for f in corpus.mixture] == [0.25, 0.75]
    assert corpus.train_samples == sum(f.taken for f in corpus.mixture)

    from train.commands.evaluate import held_out, held_out_parts  # `evaluate`: the same parts, scored per source

    text = held_out(load_raw(config.data, config.training), config.data)
    assert text.parts is not None and [set(r.splits) for _, r in text.parts] == [{"validation"}, {"validation"}]
    parts = held_out_parts(config.data, text, tokenizer)
    assert parts is not None and {k: len(v) for k, v in parts.items()} == {"news": 10, "legal": 10}


def test_an_error_in_a_mixtures_source_names_the_option_as_the_user_set_it(tmp_path: Path) -> None:
    """Each source is read as the data section with that dataset alone: the copy keeps where each option was set."""
    for name in ("news", "legal"):
        (tmp_path / f"{name}.txt").write_text("".join(f"{name} {i}\n" for i in range(10)))
    config = config_for(f"{tmp_path}/news.txt=0.5,{tmp_path}/legal.txt=0.5", validation_split_percentage="0")
    with pytest.raises(ConfigError, match=r"^MLM_VALIDATION_SPLIT_PERCENTAGE=0: holds out no example"):
        load_raw(config.data, config.training)


def _word_tokenizer(vocab: dict[str, int]):  # noqa: ANN202 - a tokenizers.Tokenizer
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer
