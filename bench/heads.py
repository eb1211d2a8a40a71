"""The heads series of ``make bench``: the masked-only head against the same model's dense head, per architecture.

Our job's vocabulary projection runs at masked positions only while training (train/model/head.py); with
``masked_only_head`` off it projects every position (the dense head). Each architecture (bert, roberta,
modernbert, deberta-v2, electra, albert, xlm-roberta, esm) is built from scratch at one size (mid on a CPU: 6
layers, hidden 384, intermediate 1536, 6 heads; base on a GPU: 12 x 768, ModernBERT-base's own 22 layers) and
trains with both heads on the real series' text and its WordPiece tokenizer (bench/real.py: the same 30,522-token
vocabulary for every architecture, so only the architecture changes), packed into 128-token blocks. The runs are
the real series' ``packed`` and ``packed-dense`` recipes with another model, each a fresh torchrun process timed
by the same probe, dense then masked-only, pair after pair. Per run: the seconds per optimizer step over the steps
after the first fifth (bench/stats.py's window); per architecture: each head's step time, min – max over the pairs,
and the ratio dense / masked-only taken within each pair, against the issue's target (1.5x for RoBERTa and
ModernBERT at the mid size on a CPU).

This module is the pure part (tested in tests/bench/test_heads.py): the settings, the architectures and their
config fields, the run flags, the run order and the summary; bench/heads_series.py prepares the data and runs them,
bench/report.py renders the summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench import real
from bench.stats import spread

HEADS: dict[str, str] = {"dense": "false", "masked-only": "true"}  # head -> --masked_only_head
RECIPE_OF_HEAD = {"dense": "packed-dense", "masked-only": "packed"}  # the real series' recipe each head's runs use

# The encoder sizes, as every architecture below names them (vocab_size is left to the tokenizer: ESM's default
# is None, which config_overrides cannot override).
SIZES: dict[str, dict[str, Any]] = {
    "mid": {"num_hidden_layers": 6, "hidden_size": 384, "intermediate_size": 1536, "num_attention_heads": 6},
    "base": {"num_hidden_layers": 12, "hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12},
}

ARCHITECTURES: dict[str, str] = {
    "bert": "BERT",
    "roberta": "RoBERTa (learned positions offset by the padding id)",
    "modernbert": "ModernBERT: RoPE, GLU feed-forward, every third layer global, the others a sliding window",
    "deberta-v2": "DeBERTa-v3's configuration: disentangled relative attention (c2p + p2c), no absolute positions",
    "electra": "ELECTRA's masked-LM generator, embeddings as wide as the encoder (ELECTRA-base/large)",
    "albert": "ALBERT: one layer shared by all, 128-wide factorised embeddings and head",
    "xlm-roberta": "XLM-RoBERTa (RoBERTa's architecture)",
    "esm": "ESM-2's configuration: rotary positions, token dropout",
}

# What an architecture sets beyond the size, at every size.
OWN_FIELDS: dict[str, dict[str, Any]] = {
    "albert": {"embedding_size": 128},  # ALBERT's at every size
    "esm": {"position_embedding_type": "rotary", "token_dropout": True},  # ESM-2
}
# ... and at one size. ModernBERT's global_attn_every_n_layers is no config field in transformers 5 (its
# layer_types follow num_hidden_layers: every third layer global). At 128 tokens its own 128-token window
# (+-64) would make the local layers nearly global: the mid model's is 64 (+-32). Base is ModernBERT-base itself.
SIZE_FIELDS: dict[tuple[str, str], dict[str, Any]] = {
    ("modernbert", "mid"): {"local_attention": 64},
    ("modernbert", "base"): {"num_hidden_layers": 22, "intermediate_size": 1152, "local_attention": 128},
}
# Fields config_overrides cannot set (a default of None, or no attribute until set): written into a config.json
# the run builds from instead of scratch:<type> (bench/heads_series.py), with the size still as overrides.
CONFIG_JSON_FIELDS: dict[str, dict[str, Any]] = {
    "deberta-v2": {
        "relative_attention": True, "pos_att_type": ["p2c", "c2p"], "position_biased_input": False,
        "max_relative_positions": -1, "position_buckets": 256, "norm_rel_ebd": "layer_norm", "share_att_key": True,
    },
}  # fmt: skip

# Where bench/flops.py's rule does not hold (see its docstring): no MFU in the summary.
NO_MFU = {"albert": "one shared layer runs num_hidden_layers times: 6 x parameters undercounts it"}

# The targets: dense / masked-only step time at the mid size on a CPU (issue 26).
TARGETS: dict[str, float] = {"roberta": 1.5, "modernbert": 1.5}
CPU_ARCHITECTURES = list(ARCHITECTURES)
GPU_ARCHITECTURES = ["bert", "roberta", "modernbert"]


@dataclass
class HeadsSettings:
    device: str
    architectures: list[str] = field(default_factory=lambda: list(CPU_ARCHITECTURES))
    size: str = "mid"
    pairs: int = 3
    max_steps: int = 10
    batch_size: int = 8
    logging_steps: int = 2
    corpus_mb: float = 8.0  # the real series' corpus: 8 MiB gives the tokenizer its full 30,522 tokens
    threads: int | None = 1  # OMP_NUM_THREADS of each run; None: as the launcher sets it


def default_heads_settings(device: str) -> HeadsSettings:
    if device == "cuda":
        # One H200, bench/gpu.sh heads: the base models with 256 blocks of 128 tokens per step, 2 pairs of 60 steps.
        return HeadsSettings("cuda", architectures=list(GPU_ARCHITECTURES), size="base", pairs=2, max_steps=60,
                             batch_size=256, logging_steps=10, threads=None)  # fmt: skip
    # On a 2-core CPU, one thread per run (see bench.demo.default_settings): a mid-size step over 8 blocks takes
    # 2.3-3.4 s with the dense head and 1.1-1.7 s with the masked-only one, by architecture (measured here), and
    # each fresh process 10-12 s to its first step, so 10 steps per run make a pair of one architecture about 70 s,
    # a pair of the 8 about 9 minutes, and the series' 3 pairs about 30 minutes, corpus and caches included (an
    # hour or more on a loaded machine): not part of the default `make bench`. A smaller batch would leave the
    # optimizer step, the same for both heads, a larger share of each step.
    return HeadsSettings("cpu")


def check(settings: HeadsSettings) -> None:
    """Names that are not architectures or sizes, and sizes too small to time, are errors that say what is known."""
    for name in settings.architectures:
        if name not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {name!r}; expected one of {', '.join(ARCHITECTURES)}")
    if settings.size not in SIZES:
        raise ValueError(f"unknown size {settings.size!r}; expected one of {', '.join(SIZES)}")
    if settings.max_steps < 2:
        raise ValueError(f"max_steps={settings.max_steps}: at least 2 steps are needed to time a run")
    if settings.pairs < 1 or settings.batch_size < 1:
        raise ValueError("pairs and batch_size must be at least 1")


def config_fields(name: str, size: str) -> dict[str, Any]:
    """The config fields an architecture's runs override, at a size."""
    fields = {**SIZES[size], **OWN_FIELDS.get(name, {}), **SIZE_FIELDS.get((name, size), {})}
    if name == "electra":  # ELECTRA-base and -large: embeddings as wide as the encoder (no projection)
        fields["embedding_size"] = fields["hidden_size"]
    return fields


def config_overrides(name: str, size: str) -> str:
    """config_fields as the job's ``config_overrides`` string (booleans as update_from_string reads them)."""
    return ",".join(
        f"{key}={str(value).lower() if isinstance(value, bool) else value}"
        for key, value in config_fields(name, size).items()
    )


def config_json(name: str) -> dict[str, Any] | None:
    """The config.json an architecture's runs build from, or None where ``scratch:<type>`` serves."""
    fields = CONFIG_JSON_FIELDS.get(name)
    return {"model_type": name, **fields} if fields is not None else None


def as_real(settings: HeadsSettings) -> real.RealSettings:
    """The real series' settings with the same sizes: its corpus, tokenizer and packed recipes serve both series."""
    return real.RealSettings(
        settings.device, models=["tiny"], recipes=list(RECIPE_OF_HEAD.values()), pairs=settings.pairs,
        max_steps=settings.max_steps, batch_size=settings.batch_size, logging_steps=settings.logging_steps,
        corpus_mb=settings.corpus_mb, threads=settings.threads,
    )  # fmt: skip


def run_flags(name: str, head: str, settings: HeadsSettings, corpus: str, tokenizer: str, model: str) -> list[str]:
    """The argument list of one run: the real series' packed recipe of that head (bench/real.py: packed 128-token
    blocks, the same TrainingArguments, the launcher's decisions for the device), with this architecture.
    ``model`` is ``scratch:<type>``, or the path of its config.json (config_json)."""
    argv = real.recipe_flags(RECIPE_OF_HEAD[head], as_real(settings), "tiny", corpus, tokenizer)
    replaced = {"--model_name_or_path": model, "--config_overrides": config_overrides(name, settings.size)}
    return [replaced.get(argv[i - 1], arg) if i else arg for i, arg in enumerate(argv)]


def describe_architectures(settings: HeadsSettings, sources: dict[str, str]) -> dict[str, Any]:
    """Each architecture as the results record it: what it is, what its runs build from (``sources``: scratch:<type>
    or a config.json's path), that config.json's fields, and its overrides."""
    return {
        name: {
            "what": ARCHITECTURES[name],
            "model": sources[name],
            "config_json": config_json(name),
            "config_overrides": config_overrides(name, settings.size),
        }
        for name in settings.architectures
    }


def describe_flags(settings: HeadsSettings) -> dict[str, list[str]]:
    """Each head's flags as the report lists them, with placeholders for the architecture's model and overrides
    and the machine's paths (the report reads the same on every machine)."""
    first = settings.architectures[0]
    overrides = config_overrides(first, settings.size)
    return {
        head: [
            "<overrides>" if f == overrides else f
            for f in run_flags(first, head, settings, "<corpus>", "<tokenizer>", "<model>")
        ]
        for head in HEADS
    }


def schedule(settings: HeadsSettings) -> list[tuple[int, str, str]]:
    """(pair, architecture, head) in run order: each architecture's dense run then its masked-only run, pair after
    pair across the architectures, so a time limit keeps complete pairs of every architecture it reached."""
    return [
        (rep, name, head) for rep in range(1, settings.pairs + 1) for name in settings.architectures for head in HEADS
    ]


def step_seconds(run: dict[str, Any]) -> float:
    """Seconds per optimizer step over the run's timed window (bench.stats.run_metrics: the steps after the first
    fifth), from the samples/s it measured there."""
    return run["probe"]["samples_per_step"] / run["samples_per_s"] if run["samples_per_s"] > 0 else float("inf")


def target(name: str, settings: HeadsSettings) -> float | None:
    """The issue's target ratio for an architecture, where it states one: the mid size on a CPU."""
    return TARGETS.get(name) if settings.size == "mid" and settings.device == "cpu" else None


HEAD_METRICS = ("step_s", "real_tokens_per_s", "peak_memory_bytes", "wall_s")


def summarise(runs: list[dict[str, Any]], settings: HeadsSettings) -> dict[str, Any]:
    """Per architecture: each head's figures (min / median / max), the ratio dense / masked-only step time within
    each pair, and the target where the issue states one (met: in every pair)."""
    ratio = real.Comparison("dense / masked-only step time", "dense", "masked-only")
    summary: dict[str, Any] = {}
    for name in settings.architectures:
        mine = [r for r in runs if r["architecture"] == name]  # each run's recipe is its head
        if not mine:
            continue
        heads: dict[str, Any] = {}
        for head in HEADS:
            rs = [r for r in mine if r["recipe"] == head]
            if rs:
                heads[head] = {m: spread([r[m] for r in rs]) for m in HEAD_METRICS}
                mfus = [r["mfu"] for r in rs if r.get("mfu") is not None and name not in NO_MFU]
                heads[head]["mfu"] = spread(mfus) if mfus else None
        values = list(real.paired(mine, ratio, metric="step_s").values())
        goal = target(name, settings)
        summary[name] = {
            "parameters": mine[0]["probe"]["parameters"],
            "vocab_size": mine[0]["probe"]["vocab_size"],
            "heads": heads,
            "ratio": {"values": values, **spread(values)} if values else None,
            "target": goal,
            "pairs_meeting_target": sum(v >= goal for v in values) if goal is not None else None,
        }
    return summary
