"""A tokenizer trained on the training text for a model built from scratch, of the kind its family uses:
WordPiece for BERT-likes, byte-level BPE for RoBERTa/ModernBERT-likes, Unigram for ALBERT/DeBERTa/XLM-R-likes
(all three from the ``tokenizers`` library), with that family's special tokens and sequence template. Chosen from
the model type; ``MLM_TOKENIZER_TYPE`` overrides. Cached under our cache by the data's fingerprint and the kind.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
from transformers import PreTrainedTokenizerFast

from train.common import distributed
from train.common.hf import cache_key, cache_root
from train.config import DataArguments, ModelArguments
from train.data import RawData


@dataclass(frozen=True)
class Kind:
    """One family's tokenizer: its special tokens (in id order: the first ones get ids 0, 1, ...) and template."""

    name: str
    special: dict[str, str]  # PreTrainedTokenizerFast's argument names -> tokens
    start: str  # the token a sequence starts with, and the one that ends (and separates) it
    end: str


WORDPIECE = Kind(
    "wordpiece",
    {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]"},
    "[CLS]",
    "[SEP]",
)
# RoBERTa's order: <s> 0, <pad> 1, </s> 2, <unk> 3; its position ids start after the padding id.
BPE = Kind(
    "bpe",
    {
        "bos_token": "<s>",
        "pad_token": "<pad>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "mask_token": "<mask>",
        "cls_token": "<s>",
        "sep_token": "</s>",
    },  # fmt: skip
    "<s>",
    "</s>",
)
UNIGRAM = Kind(
    "unigram",
    {"pad_token": "<pad>", "unk_token": "<unk>", "cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]"},
    "[CLS]",
    "[SEP]",
)
KINDS = {kind.name: kind for kind in (WORDPIECE, BPE, UNIGRAM)}
# The families whose pretrained tokenizers are byte-level BPE or SentencePiece Unigram; every other type (BERT,
# DistilBERT, ELECTRA, MPNet, ESM, ...) gets WordPiece.
FAMILY = {
    **dict.fromkeys(("roberta", "modernbert", "longformer", "eurobert", "data2vec-text", "xmod"), "bpe"),
    **dict.fromkeys(("albert", "deberta-v2", "xlm-roberta", "xlm-roberta-xl", "camembert", "big_bird"), "unigram"),
}


def tokenizer_kind(tokenizer_type: str, model_type: str | None) -> Kind:
    """MLM_TOKENIZER_TYPE (``tokenizer_type``), or (auto) the one the model type's family uses."""
    return KINDS[FAMILY.get(model_type or "", "wordpiece") if tokenizer_type == "auto" else tokenizer_type]


def train_tokenizer(
    raw: RawData, model: ModelArguments, data: DataArguments, kind: Kind = WORDPIECE
) -> PreTrainedTokenizerFast:
    """A ``kind`` tokenizer of ``model``'s tokenizer_vocab_size trained on the training text (``data``'s
    text_column; its max_seq_length the tokenizer's), cached by the data's fingerprint."""
    key = (raw.fingerprint, model.tokenizer_vocab_size, data.text_column)
    directory = cache_root() / "tokenizers" / cache_key(*key, *([kind.name] if kind is not WORDPIECE else []))
    if (directory / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(directory))
    tokenizer = _untrained(kind)
    tokens = list(dict.fromkeys(kind.special.values()))  # <s> is both bos and cls: once
    # Its progress bar ends with blank lines on stdout, which a JSON-lines reader cannot parse: only on a terminal.
    trainer = _trainer(kind, model.tokenizer_vocab_size, tokens, show_progress=sys.stdout.isatty())
    train = raw.splits["train"]
    tokenizer.train_from_iterator(_texts(train, data.text_column), trainer=trainer, length=len(train))
    from tokenizers import processors

    start, end = (kind.start, tokenizer.token_to_id(kind.start)), (kind.end, tokenizer.token_to_id(kind.end))
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{kind.start} $A {kind.end}",
        pair=f"{kind.start} $A {kind.end} $B:1 {kind.end}:1",
        special_tokens=[start, end] if start != end else [start],
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=data.max_seq_length, **kind.special)
    tmp = directory.with_name(directory.name + f".tmp-{os.getpid()}")
    fast.save_pretrained(str(tmp))
    try:
        os.replace(tmp, directory)  # atomic: a concurrent or crashed writer never leaves half a tokenizer
    except OSError:
        pass  # another process won the race; its copy is identical
    return fast


def _texts(train: Any, column: str) -> Iterator[list[str]]:
    for batch in train.iter(batch_size=10000):
        yield batch[column]


def _untrained(kind: Kind) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    if kind is BPE:  # byte-level, as RoBERTa's: no unknown token ever, spaces kept as part of the next token
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        return tokenizer
    if kind is UNIGRAM:  # SentencePiece-style, as ALBERT's and DeBERTa-v3's: "▁" marks a word's start
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        return tokenizer
    tokenizer = Tokenizer(models.WordPiece(unk_token=kind.special["unk_token"]))  # BERT's lower-case WordPiece
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def _trainer(kind: Kind, vocab_size: int, tokens: list[str], show_progress: bool) -> Any:
    from tokenizers import pre_tokenizers, trainers

    if kind is BPE:
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        return trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=tokens, initial_alphabet=alphabet, show_progress=show_progress
        )
    if kind is UNIGRAM:
        return trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=tokens, unk_token=kind.special["unk_token"],
            show_progress=show_progress,
        )  # fmt: skip
    return trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=tokens, show_progress=show_progress)


def checkpoint_tokenizer(resume: str | None) -> PreTrainedTokenizerFast | None:
    """The tokenizer a resumed run must use when it trains its own: the checkpoint's. Training one again (on a
    fresh machine, or after the cache was cleared) gives another vocabulary: the ``tokenizers`` trainers break
    ties in hash-map order, which differs from process to process."""
    if resume is None or not (Path(resume) / "tokenizer.json").is_file():
        return None
    return PreTrainedTokenizerFast.from_pretrained(resume)


def agree_on_tokenizer(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """World rank 0's trained tokenizer on every rank. Each node trains its own where the nodes share no cache, and
    (see :func:`checkpoint_tokenizer`) two trainings on the same text differ: rank 0's files are broadcast, and a
    rank whose tokenizer differs loads them instead. One collective: every rank calls it."""
    if not distributed.initialized():
        return tokenizer
    with tempfile.TemporaryDirectory(prefix="tokenizer-") as directory:
        sent: list[tuple[str, dict[str, bytes]] | None] = [None]
        if distributed.is_world_zero():
            tokenizer.save_pretrained(directory)
            files = {path.name: path.read_bytes() for path in Path(directory).iterdir() if path.is_file()}
            sent = [(tokenizer.backend_tokenizer.to_str(), files)]
        dist.broadcast_object_list(sent, src=0)
        model, files = sent[0] or ("", {})
        if model == tokenizer.backend_tokenizer.to_str():
            return tokenizer
        for name, data in files.items():
            (Path(directory) / name).write_bytes(data)
        return PreTrainedTokenizerFast.from_pretrained(directory)
