"""The real-corpus series of ``make bench``: our recipes against transformers' run_mlm.py recipe on real text.

The data is real English from this machine (bench/corpus.py: documentation and docstrings, never downloaded),
one example per line; the tokenizer is a 30,522-token WordPiece trained on that text (bench.data.train_tokenizer).
Each model (tiny: 2 layers x 128; mid: 6 layers x 384, opt-in) trains from scratch with each recipe for the same
steps and batch, the recipes alternating in fresh torchrun processes, pair after pair. Ours: our job as it
defaults (dynamic padding, masked-only head), with ``masked_only_head`` off (the head's share), and packed.
run_mlm.py's: ``--line_by_line`` (dynamic padding by DataCollatorForLanguageModeling) and its default
``group_texts`` blocks, both with the dense head (bench/run_mlm.py). Reported: real tokens/s ratios per pair,
median [min – max], and the masked-only head's share of the speed-up.

This module is the pure part (tested in tests/bench/test_real.py): models, recipes and their flags, the run order,
and the summary of the runs; bench/real_series.py prepares the data and runs them, bench/report.py renders the
summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.demo import SMALL_MODEL
from bench.launcher import padding_flags, precision_flags
from bench.stats import METRICS, log_share, spread

BLOCK = 128  # max_seq_length of every recipe, and the block length of both packed ones (bench.data.BLOCK)
SEED = 42

MODELS: dict[str, str] = {
    "tiny": SMALL_MODEL,  # the demo series' CPU model: 2 layers x 128, the real 30,522-token vocabulary
    "mid": "n_layers=6,dim=384,hidden_dim=1536,n_heads=6,vocab_size=30522",  # about 23 M parameters, half embeddings
}

RECIPES: dict[str, str] = {
    "ours": "our default: dynamic padding (to the longest on a CPU, a multiple of 8 on a GPU), masked-only head",
    "ours-dense": "our default with masked_only_head off (the dense head)",
    "run_mlm": "run_mlm.py --line_by_line: DataCollatorForLanguageModeling pads each batch; dense head",
    "packed": "ours with padding packed (128-token blocks, documents kept apart), masked-only head",
    "run_mlm-group": "run_mlm.py's default: group_texts 128-token blocks; dense head",
    "packed-dense": "ours packed with masked_only_head off",
    "ours-compile": "our default with torch_compile (inductor); padded lengths are multiples of 8, so at most 16",
}
DEFAULT_RECIPES = ["ours", "ours-dense", "run_mlm", "packed", "run_mlm-group"]
RUN_MLM_RECIPES = ("run_mlm", "run_mlm-group")


@dataclass(frozen=True)
class Comparison:
    """A real tokens/s ratio taken per pair: ``numerator`` over ``denominator`` of the same repetition."""

    label: str
    numerator: str
    denominator: str


COMPARISONS = (
    Comparison("ours / run_mlm line_by_line", "ours", "run_mlm"),
    Comparison("packed / run_mlm group_texts", "packed", "run_mlm-group"),
    Comparison("masked-only head, dynamic (ours / ours-dense)", "ours", "ours-dense"),
    Comparison("the rest, dynamic (ours-dense / run_mlm)", "ours-dense", "run_mlm"),
    Comparison("masked-only head, packed (packed / packed-dense)", "packed", "packed-dense"),
    Comparison("the rest, packed (packed-dense / run_mlm group_texts)", "packed-dense", "run_mlm-group"),
    Comparison("packing (packed / ours)", "packed", "ours"),
    Comparison("torch_compile (ours-compile / ours)", "ours-compile", "ours"),
)

# Whole processes (torchrun start to exit, start-up and the steps): how many times faster ours finished, per pair.
WALL_COMPARISONS = (
    Comparison("run_mlm line_by_line / ours", "run_mlm", "ours"),
    Comparison("run_mlm line_by_line / ours-dense (the same head)", "run_mlm", "ours-dense"),
    Comparison("run_mlm group_texts / packed", "run_mlm-group", "packed"),
    Comparison("run_mlm group_texts / packed-dense (the same head)", "run_mlm-group", "packed-dense"),
)

# The masked-only head's share of a speed-up over run_mlm.py: ours / run_mlm = (ours / ours-dense) x (ours-dense /
# run_mlm), so the head's part is log(ours / ours-dense) / log(ours / run_mlm).
SHARES: dict[str, tuple[Comparison, Comparison]] = {
    "dynamic": (COMPARISONS[2], COMPARISONS[0]),
    "packed": (COMPARISONS[4], COMPARISONS[1]),
}


@dataclass
class RealSettings:
    device: str
    models: list[str] = field(default_factory=lambda: ["tiny"])
    recipes: list[str] = field(default_factory=lambda: list(DEFAULT_RECIPES))
    pairs: int = 3
    max_steps: int = 20
    batch_size: int = 32
    logging_steps: int = 4
    corpus_mb: float = 8.0  # 8 MiB: enough distinct words for the full 30,522-token vocabulary (1 MiB gives 14,204)
    threads: int | None = 1  # OMP_NUM_THREADS of each run; None: as the launcher sets it


def default_real_settings(device: str) -> RealSettings:
    if device == "cuda":
        return RealSettings("cuda", models=["tiny", "mid"], pairs=2, max_steps=200, logging_steps=20,
                            corpus_mb=16.0, threads=None)  # fmt: skip
    # On a 2-core CPU, one thread per run (see bench.demo.default_settings), one pair of the five recipes takes
    # about 2.5 minutes when the machine is otherwise idle: a dense-head step over 32 full 128-token blocks takes
    # about 3 s, the other recipes' steps under 1 s, and each fresh process 7-10 s to start (30-40 s under load).
    # 3 pairs of 20 steps, with the corpus and caches made once, keep the series near 10 minutes (about 20 under
    # load). The mid model takes about 30 minutes more with these sizes (its group_texts step about 14 s):
    # opt-in, --real-models tiny,mid.
    return RealSettings("cpu")


def check(settings: RealSettings) -> None:
    """Names that are not models or recipes, and sizes too small to time, are errors that say what is known."""
    for model in settings.models:
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r}; expected one of {', '.join(MODELS)}")
    for name in settings.recipes:
        if name not in RECIPES:
            raise ValueError(f"unknown recipe {name!r}; expected one of {', '.join(RECIPES)}")
    if settings.max_steps < 2:
        raise ValueError(f"max_steps={settings.max_steps}: at least 2 steps are needed to time a run")
    if settings.pairs < 1 or settings.batch_size < 1:
        raise ValueError("pairs and batch_size must be at least 1")


def recipe_module(name: str) -> str:
    """The per-rank program torchrun starts for a recipe."""
    return "bench.run_mlm" if name in RUN_MLM_RECIPES else "bench.harness"


def training_flags(settings: RealSettings) -> list[str]:
    """TrainingArguments every recipe gets, the same: steps, batch, seed, logging; no evaluation, no checkpoint."""
    flags = [
        "--per_device_train_batch_size", str(settings.batch_size), "--max_steps", str(settings.max_steps),
        "--logging_steps", str(settings.logging_steps), "--seed", str(SEED), "--report_to", "none",
        "--eval_strategy", "no", "--save_strategy", "no",
    ]  # fmt: skip
    # What our launcher gives our default on a GPU (bf16 + tf32; nothing on a CPU); run_mlm.py users pass it too.
    return flags + precision_flags(settings.device)


def recipe_flags(name: str, settings: RealSettings, model: str, corpus: str, tokenizer: str) -> list[str]:
    """The full argument list of one recipe's run (bench.runner.run_once adds --output_dir and --ddp_backend)."""
    overrides = MODELS[model]
    if name in RUN_MLM_RECIPES:
        own = ["--model_type", "distilbert", "--config_overrides", overrides, "--tokenizer_name", tokenizer,
               "--train_file", corpus, "--max_seq_length", str(BLOCK)]  # fmt: skip
        if name == "run_mlm":
            own += ["--line_by_line", "true"]
        return own + training_flags(settings)
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}")
    # The whole file trains (no held-out split, as run_mlm.py's train_file without --do_eval).
    # The classic recipe: run_mlm.py's optimizer, schedule and masking, so that only the implementation differs
    # (the modern recipe a scratch model gets by default is measured against time by bench/quality.py).
    own = ["--model_name_or_path", "scratch:distilbert", "--recipe", "classic", "--config_overrides", overrides,
           "--tokenizer_name", tokenizer, "--dataset", corpus, "--validation_split_percentage", "0",
           "--max_seq_length", str(BLOCK),
           "--padding", "packed" if name.startswith("packed") else "dynamic",
           "--masked_only_head", "false" if name.endswith("-dense") else "true"]  # fmt: skip
    if name == "ours-compile":
        own += ["--torch_compile", "true"]
    # The runs start without our launcher: give our job what the launcher decides for it on this device.
    own += padding_flags(settings.device)
    return own + training_flags(settings)


def describe_recipes(settings: RealSettings) -> dict[str, Any]:
    """The recipes as the report lists them: each one's program, what it is, and its flags as the first model's
    runs get them, with placeholders for the model, the corpus and the tokenizer (the report reads the same on
    every machine)."""
    first = settings.models[0]
    return {
        name: {
            "module": recipe_module(name),
            "what": RECIPES[name],
            "flags": [
                "<model>" if f == MODELS[first] else f
                for f in recipe_flags(name, settings, first, "<corpus>", "<tokenizer>")
            ],
        }
        for name in settings.recipes
    }


def schedule(settings: RealSettings) -> list[tuple[str, int, str]]:
    """(model, pair, recipe) in run order: each model's recipes one after another, pair after pair, so a burst of
    load elsewhere hits every recipe of a pair alike."""
    return [
        (model, rep, name)
        for model in settings.models
        for rep in range(1, settings.pairs + 1)
        for name in settings.recipes
    ]


def paired(runs: list[dict[str, Any]], comparison: Comparison, metric: str = "real_tokens_per_s") -> dict[int, float]:
    """{pair: numerator / denominator} over the pairs where both recipes ran (runs of one model)."""
    by_key = {(r["rep"], r["recipe"]): r[metric] for r in runs}
    reps = sorted({r["rep"] for r in runs})
    return {
        rep: by_key[(rep, comparison.numerator)] / by_key[(rep, comparison.denominator)]
        for rep in reps
        if (rep, comparison.numerator) in by_key and by_key.get((rep, comparison.denominator), 0) > 0
    }


def summarise(runs: list[dict[str, Any]], settings: RealSettings) -> dict[str, Any]:
    """Per model: each recipe's figures (median [min – max]), the ratios per pair, and the head's share."""
    summary: dict[str, Any] = {}
    for model in settings.models:
        mine = [r for r in runs if r["model"] == model]
        if not mine:
            continue
        recipes: dict[str, Any] = {}
        for name in dict.fromkeys(r["recipe"] for r in mine):
            rs = [r for r in mine if r["recipe"] == name]
            recipes[name] = {m: spread([r[m] for r in rs]) for m in METRICS}
            recipes[name]["real_tokens_per_sample"] = rs[0]["probe"]["real_tokens_per_sample"]
            losses = [r["final_loss"] for r in rs if r["final_loss"] is not None]
            recipes[name]["final_loss"] = spread(losses) if losses else None
        comparisons = []
        for comparison in COMPARISONS:
            per_pair = paired(mine, comparison)
            if per_pair:
                values = list(per_pair.values())
                comparisons.append({"label": comparison.label, "values": values, **spread(values)})
        walls = []
        for comparison in WALL_COMPARISONS:
            per_pair = paired(mine, comparison, metric="wall_s")
            if per_pair:
                values = list(per_pair.values())
                walls.append({"label": comparison.label, "values": values, **spread(values)})
        shares = []
        for padding, (part, whole) in SHARES.items():
            parts, wholes = paired(mine, part), paired(mine, whole)
            values = [s for rep in parts if rep in wholes and (s := log_share(parts[rep], wholes[rep])) is not None]
            if values:
                shares.append({"padding": padding, "label": f"{part.label} of {whole.label}", "values": values,
                               **spread(values)})  # fmt: skip
        summary[model] = {"recipes": recipes, "comparisons": comparisons, "wall": walls, "head_share": shares}
    return summary
