"""What we borrow from transformers' models and their configs (transformers 5.25, ``configuration_utils.py``,
``modeling_utils.py``): which attention implementation a model runs, and which ones a model class offers."""

from __future__ import annotations

from typing import Any

from train.borrowed.touch import borrows


@borrows("transformers", "5.25", "configuration_utils.py PreTrainedConfig._attn_implementation")
def attn_implementation(config: Any) -> str | None:
    """The attention implementation a model with ``config`` runs (``sdpa``, ``eager``, ``flash_attention_2``...),
    or None where the config does not say yet (transformers 5.25, ``configuration_utils.py``: the property
    ``PreTrainedConfig._attn_implementation``, set by ``from_pretrained``/``from_config`` once the model chose).
    The packed rows' masks depend on it, the run records it, a rank's meta-device model is built with it. The
    ``attn_implementation`` argument only sets it; nothing public reads it back."""
    return getattr(config, "_attn_implementation", None)


@borrows("transformers", "5.25", "modeling_utils.py PreTrainedModel._supports_sdpa")
def supports_sdpa(model_class: Any) -> bool:
    """Whether the model class has an SDPA attention (transformers 5.25, ``modeling_utils.py``, the class attribute
    ``PreTrainedModel._supports_sdpa``, which ``get_correct_attn_implementation`` reads to default to SDPA): the
    implementation a model would run, known before it is built. The public ``get_correct_attn_implementation``
    needs an instance."""
    return bool(getattr(model_class, "_supports_sdpa", False))


@borrows("transformers", "5.25", "modeling_utils.py PreTrainedModel._supports_flash_attn")
def supports_flash_attention(model_class: Any) -> bool:
    """Whether the model class has a flash attention (transformers 5.25, ``modeling_utils.py``, the class
    attribute ``PreTrainedModel._supports_flash_attn``, read by ``_flash_attn_can_dispatch``): asked before the
    model is built, to choose flash_attention_2 on a GPU where it is installed. No public class-level query."""
    return bool(getattr(model_class, "_supports_flash_attn", False))
