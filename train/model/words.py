"""Where words start in a tokenizer's vocabulary: the one fact whole-word masking needs.

transformers' collator finds words from each sample's ``offset_mapping`` (a token continues a word when it starts
where the previous one ended), which our tokenized caches and packed blocks do not keep: the offsets are lost
when documents are concatenated and cut. The tokenizer's own model says the same thing per vocabulary entry,
so one table of the vocabulary serves every sample, packed or not, cached or streamed:

- WordPiece (BERT, ELECTRA, MPNet): a token continues a word when it starts with the continuing-subword prefix
  (``##``);
- byte-level BPE (RoBERTa, ModernBERT): a token starts a word when it starts with the byte-level space (``Ġ``);
- SentencePiece-style, Metaspace pre-tokenized (ALBERT, DeBERTa-v3, XLM-R, Unigram or BPE): a token starts a word
  when it starts with the metaspace (``▁``).

One difference from the offsets rule: BERT's pre-tokenizer makes punctuation its own word (``end .``), as
Google's original whole-word masking did, where adjacent offsets would join it to the word before it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np

from train.common.errors import ConfigError

BYTE_LEVEL_SPACE = "Ġ"  # the byte-level alphabet's spelling of " " (bytes_to_unicode maps 0x20 to U+0120)


def _pre_tokenizers(node: Any) -> Iterator[dict[str, Any]]:
    """Every pre-tokenizer in a tokenizer.json's pre_tokenizer, Sequences unrolled."""
    if isinstance(node, dict):
        yield node
        for child in node.get("pretokenizers", ()):
            yield from _pre_tokenizers(child)


def word_starts(tokenizer: Any, label: str) -> np.ndarray:
    """For every token id of ``tokenizer``, whether it starts a word; ConfigError (naming ``label``, the option
    that chose the tokenizer) when the tokenizer's model says nothing about words."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ConfigError(
            f"whole_word_mask: the tokenizer of {label} ({type(tokenizer).__name__}) is not a fast tokenizer, "
            "so its word boundaries are unknown; set whole_word_mask false or choose another tokenizer"
        )
    spec = json.loads(backend.to_str())
    model, kinds = spec.get("model") or {}, list(_pre_tokenizers(spec.get("pre_tokenizer")))
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    prefix = model.get("continuing_subword_prefix")
    if prefix:
        return np.array([not (t or "").startswith(prefix) for t in tokens], dtype=bool)
    if any(k.get("type") == "ByteLevel" for k in kinds):
        return np.array([(t or "").startswith(BYTE_LEVEL_SPACE) for t in tokens], dtype=bool)
    metaspace = next((k.get("replacement", "▁") for k in kinds if k.get("type") == "Metaspace"), None)
    if metaspace is not None:
        return np.array([(t or "").startswith(metaspace) for t in tokens], dtype=bool)
    raise ConfigError(
        f"whole_word_mask: the tokenizer of {label} ({model.get('type', '?')} without a known word marker) does "
        "not say where words start; set whole_word_mask false or choose another tokenizer"
    )
