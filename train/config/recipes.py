"""Recipes: the values a run gets for the options it does not set, by what it trains.

``recipe: auto`` (the default) gives a model trained from scratch the ``modern`` recipe and a pretrained one the
``classic`` one (what :func:`train.config.model_source.model_source` says the name is: the rule the loader, doctor
and the model card use). A recipe is the lowest layer above the schema's defaults: any option set in the YAML, the
environment or on the command line wins over it, and ``Config.sources`` names the recipe for the rest, so the
banner, ``plan`` and run.json say where each value came from.

- ``classic``: the schema's defaults as they are, the seed's and BERT's 2019 recipe (15 % masking, linear decay,
  AdamW's defaults). Right for continued pretraining of a pretrained model: its optimizer was tuned for those,
  and a modern learning rate would wipe out what it learned.
- ``modern``: what recent encoders trained from scratch use, each with its source:

  - 30 % of tokens masked in training, 15 % in evaluation (Wettig et al. 2023, "Should You Mask 15% in Masked
    Language Modeling?"; MosaicBERT and ModernBERT train at 30 %): more signal per sequence, and evaluation stays
    comparable with 15 %-masked runs.
  - warmup-stable-decay, the decay a ``1-sqrt`` over the last ``decay_ratio`` (20 %) of the steps (Hu et al.
    2024, MiniCPM; Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training
    Durations": a 20 % 1-sqrt cooldown matches cosine; ModernBERT and Ettin train this way). The rate stays high
    until the decay, so a time budget (train/run/budget.py) or a longer run loses nothing to a schedule fixed in
    advance.
  - AdamW with betas (0.9, 0.98) and eps 1e-6 (RoBERTa, Liu et al. 2019; ModernBERT's StableAdamW settings) and
    weight decay 0.01 (BERT, RoBERTa); the Trainer already leaves biases and norms undecayed
    (``Trainer.get_decay_parameter_names``).
  - learning rate 1e-3 with 6 % warm-up: small encoders trained from scratch take rates an order above the
    Trainer's 5e-5 (Cramming, Geiping and Goldstein 2023: 1e-3 for BERT-base; ModernBERT-base 8e-4); the
    time-to-quality series (bench/quality.py) measures it on real text. Larger models should set a lower one.
  - documents kept apart in full blocks (``padding: packed``: no padding, no attention across documents).

The decay's length is a fraction because the steps are known only when training starts (epochs, a stream's
max_steps, a time budget's plan): train/common/schedules.py turns it into transformers' ``num_decay_steps``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from train.common.schedules import WSD
from train.config.model_source import model_source

AUTO, MODERN, CLASSIC = "auto", "modern", "classic"

# Each value as a command line would give it (the layers convert and check them like any other).
RECIPES: Mapping[str, Mapping[str, str]] = {
    CLASSIC: {},
    MODERN: {
        "mlm_probability": "0.3",
        "eval_mlm_probability": "0.15",
        "lr_scheduler_type": WSD,
        "lr_scheduler_kwargs": '{"decay_type": "1-sqrt"}',
        "learning_rate": "1e-3",
        "warmup_steps": "0.06",
        "adam_beta2": "0.98",
        "adam_epsilon": "1e-6",
        "weight_decay": "0.01",
        "padding": "packed",
    },
}


def recipe_for(choice: str, model_name: str) -> str:
    """The recipe a run gets: ``choice`` unless it is ``auto``, which is modern for a model trained from scratch
    and classic for a pretrained one."""
    if choice != AUTO:
        return choice
    return CLASSIC if model_source(model_name).pretrained else MODERN


def recipe_source(name: str, option: str) -> str:
    """How errors and run.json name a value the recipe set (``Config.sources``)."""
    return f"the {name} recipe's {option}"


def is_recipe_source(source: str) -> bool:
    """Whether ``Config.sources`` names a value as the recipe's (``recipe_source``), not one a user set."""
    return any(source.startswith(f"the {name} recipe's ") for name in RECIPES)


def recipe_summary(recipe: str, model_name: str, training: Any, decay_ratio: float) -> str:
    """One line for the banner: the recipe the run got, why, and the optimizer and schedule it trains with
    (whichever layer set them)."""
    name = recipe_for(recipe, model_name)
    why = f" (auto: {'pretrained' if name == CLASSIC else 'trained from scratch'})" if recipe == AUTO else ""
    kind = str(getattr(training.lr_scheduler_type, "value", training.lr_scheduler_type))
    schedule = f"{kind}, decaying over the last {decay_ratio:.0%}" if kind == WSD else kind
    warmup = training.warmup_steps
    warmup_text = f"{warmup:.0%} of the steps" if 0 < warmup < 1 else f"{int(warmup)} steps"
    return (
        f"{name}{why}: learning rate {training.learning_rate:g}, {schedule}, warm-up {warmup_text}; AdamW betas "
        f"({training.adam_beta1:g}, {training.adam_beta2:g}), eps {training.adam_epsilon:g}, weight decay "
        f"{training.weight_decay:g}"
    )
