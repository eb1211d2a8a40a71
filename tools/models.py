"""``python -m tools.models --write|--check FILE``: docs/models.md's model table, generated from what the code does
with each architecture (tools/generated.py: between two marker comments; ``make lint`` checks it).

Each row is found, not stated: a tiny model of the type is built as the job builds it, and the table says which
attention implementation transformers gave it, whether the masked-only head's probe accepted it, and which
tokenizer kind a from-scratch run trains for it.
"""

from __future__ import annotations

import sys
import typing
from typing import Any

from tools.generated import Section, cell
from train.borrowed.transformers_models import attn_implementation
from train.common.errors import ConfigError
from train.config import load_config
from train.config.sections import ModelArguments
from train.model.head import use_masked_only_head
from train.model.load import attention_implementation
from train.model.packing import SUPPORTED, unsupported_reason
from train.model.tokenizer_training import tokenizer_kind

# The architectures users continue pre-training, by model_type; each with what its config needs to be tiny. The
# tests run every one (tests/test_head.py, tests/e2e/test_model_matrix.py).
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "bert": {},
    "distilbert": {},
    "roberta": {},
    "xlm-roberta": {},
    "camembert": {},
    "electra": {"embedding_size": 16},
    "albert": {"embedding_size": 16},
    "deberta-v2": {},
    "modernbert": {"global_attn_every_n_layers": 2, "local_attention": 16},
    "mpnet": {},
    "esm": {"mask_token_id": 4},
    "eurobert": {"num_key_value_heads": 2},
}
VOCAB = 97


def tiny_config(model_type: str, **extra: Any) -> Any:
    """A two-layer, 32-wide config of ``model_type`` (DistilBERT names its fields its own way)."""
    from transformers import AutoConfig

    if model_type == "distilbert":
        sizes = {"dim": 32, "hidden_dim": 64, "n_layers": 2, "n_heads": 2}
    else:
        sizes = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    values = {"vocab_size": VOCAB, "max_position_embeddings": 64, "pad_token_id": 0, **sizes}
    return AutoConfig.for_model(model_type, **values, **ARCHITECTURES[model_type], **extra)


def row(model_type: str) -> tuple[str, str, str]:
    """(attention, head, tokenizer kind) of ``model_type`` as the job would train it from scratch on a CPU."""
    attention, head, kind, _ = full_row(model_type)
    return attention, head, kind


def full_row(model_type: str) -> tuple[str, str, str, str]:
    """:func:`row` and on which attention implementations the model keeps a packed row's documents apart."""
    from transformers import AutoModelForMaskedLM

    config = load_config([], {})
    arch = tiny_config(model_type)
    model = AutoModelForMaskedLM.from_config(arch, attn_implementation=attention_implementation(config.model, arch))
    try:
        use_masked_only_head(model)
        head = "masked-only"
    except ConfigError:
        head = "dense"
    # Of the implementations MLM_ATTN_IMPLEMENTATION offers, the ones the model keeps documents apart on.
    offered = typing.get_args(typing.get_type_hints(ModelArguments)["attn_implementation"])
    possible = [a for a in SUPPORTED.get(model_type, ()) if a in offered and unsupported_reason(arch, a) is None]
    apart = ", ".join(possible) or "no"
    return attn_implementation(model.config), head, tokenizer_kind(config.model.tokenizer_type, model_type).name, apart


KIND_NAMES = {"wordpiece": "WordPiece", "bpe": "byte-level BPE", "unigram": "Unigram"}


def models_table() -> str:
    from transformers.utils import logging

    logging.set_verbosity_error()  # the tiny configs keep their pretrained special-token ids: no matter here
    lines = [
        "| model type | attention (CPU) | head | tokenizer trained from scratch | documents apart (packed) on |",
        "|---|---|---|---|---|",
    ]
    for model_type in ARCHITECTURES:
        attention, head, kind, apart = full_row(model_type)
        lines.append(f"| {cell(model_type)} | {attention} | {head} | {KIND_NAMES[kind]} | {apart} |")
    return "\n".join(lines)


SECTION = Section("models", "tools/models.py", models_table)
main = SECTION.main


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
