"""The packing series of ``make bench``: how the padding modes lay real text out, how fast each trains, and what
keeping a packed block's documents apart does to the loss on whole documents.

Modes (``--padding``, train/config/schema.py): ``packed`` (documents concatenated into 128-token blocks and kept
apart: positions restart per document, block-diagonal attention, train/model/packing.py), ``packed_crossing`` (the same
blocks attending across documents, run_mlm.py's group_texts), ``dynamic`` (each batch padded to its longest
example; to a multiple of 8 on a GPU) and ``padding_free`` (a batch's examples laid end to end in one row, kept
apart, no padding). Every run is the heads series' masked-only run of an architecture (bench/heads.py: the real
series' packed recipe, a model from scratch at the mid size, the real-text corpus and its 30,522-token WordPiece)
with another ``--padding``, in a fresh torchrun process timed by the same probe. Three measurements:

1. layout: per mode, the packing efficiency (real tokens / positions computed) computed as the job computes it
   (its collator's ``measure()`` in training-size batches) over samples drawn at random, as the Trainer draws
   them (the job's own figure, beside it from each run's run.json, draws its 256 samples at random too), and the
   share of the corpus's tokens the mode trains on (packing drops each map batch's last partial block, dynamic
   padding cuts lines past 128 tokens);
2. speed: real tokens/s of every mode, the modes alternating repeat after repeat, ratios taken within a repeat.
   The unpacked modes get as many real tokens per step as the packed ones (``examples_per_step``), so a ratio
   compares the layouts, not the optimizer step's share of a step;
3. quality: ``packed`` and ``packed_crossing`` trained from the same seed on the same blocks for the same steps
   (the same tokens, the same masks: the collator masks by sample index), then each held-out document (lines
   removed from the training file, bench/packing_series.py) evaluated alone, with masks fixed by ``EVAL_SEED``,
   the same for every model; the loss per masked token, per seed, and crossing - isolated, min - max over seeds.

This module is the pure part (tested in tests/bench/test_packing_series.py): the settings, run flags, run order,
the held-out split and evaluation; bench/packing_report.py the summary and the report; bench/packing_series.py
prepares the data and runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench import heads, real

BLOCK = real.BLOCK  # max_seq_length of every run, and the packed modes' block
MODES: dict[str, str] = {
    "packed": "128-token blocks, each document attending to itself only, positions restarting (train/model/packing.py)",
    "packed_crossing": "the same blocks, attention across documents (run_mlm.py's group_texts)",
    "dynamic": "each batch padded to its longest example (a multiple of 8 on a GPU)",
    "padding_free": "each batch's examples end to end in one row, kept apart, no padding",
}
ISOLATED, CROSSING = "packed", "packed_crossing"  # the quality comparison's two modes
# The targets for the packing efficiency (issue 28).
TARGETS: dict[str, float] = {"packed": 0.95, "padding_free": 1.0}
# The heads series' architectures that keep documents apart on SDPA when built from scratch:<type>: deberta-v2
# takes a config.json and eager attention only, and ESM-2's token_dropout mixes a row's documents (refused by
# train/model/packing.py), so both are left out.
ARCHITECTURES = ("bert", "roberta", "modernbert", "electra", "albert", "xlm-roberta")
EVAL_SEED = 0  # the held-out documents' masks: one seed for every model, so their losses compare position by position
MAX_ACCEPTED_LOAD_EXCESS = 0.5  # load average above the runs' threads by more than this: the machine was shared


# Real tokens/s ratios, each taken within a repeat (bench.real.paired).
COMPARISONS = (
    real.Comparison("documents apart (packed / packed_crossing)", ISOLATED, CROSSING),
    real.Comparison("packed / dynamic", ISOLATED, "dynamic"),
    real.Comparison("packed_crossing / dynamic", CROSSING, "dynamic"),
    real.Comparison("padding_free / dynamic", "padding_free", "dynamic"),
    real.Comparison("padding_free / packed", "padding_free", ISOLATED),
)


@dataclass
class PackingSettings:
    device: str
    architectures: list[str] = field(default_factory=lambda: ["bert"])
    modes: list[str] = field(default_factory=lambda: list(MODES))
    size: str = "mid"
    repeats: int = 3  # speed: rounds of every mode
    max_steps: int = 8  # speed: steps per run (7 timed after the first fifth)
    blocks: int = 8  # 128-token blocks per step; the unpacked modes get as many real tokens per step
    seeds: int = 3  # quality: training seeds, each a packed and a packed_crossing run
    quality_steps: int = 50
    # Quality runs only: the Trainer's 5e-5 barely moves a model from scratch in 50 steps (its loss stays near
    # ln 30,522 = 10.3); at 5e-4 the mid model reaches a training loss of 6.1-6.8 (measured, 3 seeds), where the
    # context a model learns to use starts to show in the held-out loss.
    learning_rate: float = 5e-4
    warmup_steps: int = 5
    heldout: int = 1000  # held-out documents (lines), each evaluated alone
    measured_samples: int = 8192  # samples collated per mode for the efficiency (the job measures 256)
    logging_steps: int = 2
    corpus_mb: float = 8.0  # the real series' corpus
    threads: int | None = 1  # OMP_NUM_THREADS of each run; None: as the launcher sets it


def default_packing_settings(device: str) -> PackingSettings:
    if device == "cuda":
        # One H200, bench/gpu.sh packing: BERT-base, 256 blocks of 128 tokens per step (32,768 real tokens, the
        # unpacked modes as many), 2 repeats of 30 steps, then 3 seeds of 100 quality steps. Estimated, not
        # measured (no GPU has run it): 20-25 s per fresh process, so about 3.5 minutes of speed runs and 3 of
        # quality runs after a minute or two of corpus, tokenizer and caches: within gpu.sh's budget, and the
        # results are written after each repeat and each seed, so the time limit keeps what was measured.
        return PackingSettings("cuda", size="base", repeats=2, max_steps=30, blocks=256, quality_steps=100,
                               learning_rate=3e-4, warmup_steps=10, logging_steps=10, threads=None)  # fmt: skip
    # On a 2-core CPU, one thread per run, measured here on a machine shared with a test suite (load 2-5): a
    # mid-size masked-only step of 1,024 real tokens takes 1.2-1.8 s packed, 1.6-1.9 s padding-free (one
    # 1,000-token row) and 3.5-4.5 s with dynamic padding (51 random lines padded to their longest, 76-109 tokens:
    # the corpus's line lengths have a long tail; 8 s under heavier load); a fresh process 8-11 s to its first
    # step. A repeat of the four speed runs took 2.5 minutes, a 50-step quality run 70-100 s and its evaluation
    # (1,000 documents) 5-15 s; the series 17.5 minutes with the corpus, tokenizer and caches made anew.
    return PackingSettings("cpu")


def check(settings: PackingSettings) -> None:
    """Unknown names and sizes too small to measure are errors that say what is known."""
    for name in settings.architectures:
        if name not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {name!r}; expected one of {', '.join(ARCHITECTURES)}")
    for mode in settings.modes:
        if mode not in MODES:
            raise ValueError(f"unknown padding mode {mode!r}; expected one of {', '.join(MODES)}")
    if len(set(settings.modes)) != len(settings.modes):
        raise ValueError(f"padding modes named twice: {','.join(settings.modes)}")
    if settings.size not in heads.SIZES:
        raise ValueError(f"unknown size {settings.size!r}; expected one of {', '.join(heads.SIZES)}")
    if settings.max_steps < 2 or settings.quality_steps < 2:
        raise ValueError("at least 2 steps are needed to time a run (max_steps and quality_steps)")
    positive = ("repeats", "blocks", "heldout", "measured_samples", "logging_steps")
    for name in positive:
        if getattr(settings, name) < 1:
            raise ValueError(f"{name} must be at least 1, not {getattr(settings, name)}")
    if settings.seeds < 0:
        raise ValueError(f"seeds must be at least 0 (0: no quality runs), not {settings.seeds}")
    if settings.seeds and not {ISOLATED, CROSSING} <= set(settings.modes):
        raise ValueError(f"the quality runs compare {ISOLATED} with {CROSSING}: name both, or give 0 seeds")


def examples_per_step(mode: str, settings: PackingSettings, tokens_per_example: float) -> int:
    """Samples per step: ``blocks`` for the packed modes; for the others as many examples as make the same real
    tokens on average (``tokens_per_example``: the corpus's mean, specials included)."""
    # Not at the top: train.data imports datasets, which reads HF_HOME at import; bench.run imports this first.
    from train.data import Padding

    if Padding(mode).packs:
        return settings.blocks
    if tokens_per_example <= 0:
        raise ValueError(f"tokens_per_example={tokens_per_example}: the corpus has no tokens")
    return max(1, round(settings.blocks * BLOCK / tokens_per_example))


def quality_seeds(settings: PackingSettings) -> list[int]:
    """The quality runs' training seeds: the real series' seed and the next ones."""
    return [real.SEED + i for i in range(settings.seeds)]


def replace_flags(argv: Sequence[str], values: dict[str, str]) -> list[str]:
    """``argv`` with each named flag's value replaced; a flag that is not there is an error (a recipe whose flags
    changed must not silently keep the old value)."""
    missing = [name for name in values if name not in argv]
    if missing:
        raise ValueError(f"flags not in the run's arguments: {', '.join(missing)}")
    return [values.get(argv[i - 1], arg) if i else arg for i, arg in enumerate(argv)]


def run_flags(
    name: str, mode: str, settings: PackingSettings, corpus: str, tokenizer: str, batch: int, seed: int | None = None
) -> list[str]:
    """One run's arguments: the heads series' masked-only run of the architecture (the real series' packed recipe
    with that model) with this padding mode and batch. ``seed`` given: a quality run (its seed, its steps and a
    learning rate a short run learns with); else a speed run."""
    steps = settings.max_steps if seed is None else settings.quality_steps
    shape = heads.HeadsSettings(
        settings.device, architectures=[name], size=settings.size, max_steps=steps, batch_size=batch,
        logging_steps=settings.logging_steps, corpus_mb=settings.corpus_mb, threads=settings.threads,
    )  # fmt: skip
    argv = replace_flags(
        heads.run_flags(name, "masked-only", shape, corpus, tokenizer, f"scratch:{name}"), {"--padding": mode}
    )
    if seed is None:
        return argv
    warmup = ["--warmup_steps", str(settings.warmup_steps)]
    return [*replace_flags(argv, {"--seed": str(seed)}), "--learning_rate", str(settings.learning_rate), *warmup]


def describe_flags(settings: PackingSettings) -> dict[str, list[str]]:
    """Each mode's speed-run flags as the report lists them, with placeholders for the machine's paths and the
    batch (it depends on the corpus), and the quality runs' additions."""
    first = settings.architectures[0]
    described = {
        mode: replace_flags(
            run_flags(first, mode, settings, "<corpus>", "<tokenizer>", 1), {"--per_device_train_batch_size": "<batch>"}
        )
        for mode in settings.modes
    }
    # Every argument list here is flag, value, flag, value...: the quality runs' differences as flag value pairs.
    speed, quality = (
        dict(zip(argv[::2], argv[1::2], strict=True))
        for argv in (run_flags(first, ISOLATED, settings, "<c>", "<t>", 1, seed=s) for s in (None, real.SEED))
    )
    described["quality runs, beside those"] = [f"{k} {v}" for k, v in quality.items() if speed.get(k) != v]
    return described


def speed_schedule(settings: PackingSettings) -> list[tuple[int, str, str]]:
    """(repeat, architecture, mode) in run order: every mode of an architecture one after the other, repeat after
    repeat, so load from elsewhere hits the modes of a repeat alike and a time limit keeps whole repeats."""
    return [
        (rep, name, mode)
        for rep in range(1, settings.repeats + 1)
        for name in settings.architectures
        for mode in settings.modes
    ]


def quality_schedule(settings: PackingSettings) -> list[tuple[int, str, str]]:
    """(seed, architecture, mode): isolated then crossing, seed after seed."""
    return [(seed, name, mode) for seed in quality_seeds(settings) for name in settings.architectures
            for mode in (ISOLATED, CROSSING)]  # fmt: skip


def split_heldout(lines: Sequence[str], count: int, fits: Callable[[str], bool]) -> tuple[list[str], list[str]]:
    """(training lines, held-out documents): ``count`` distinct lines spread evenly over the corpus (in each of
    ``count`` equal stretches of its distinct lines, the first that ``fits``: is short enough to be evaluated
    whole), and every occurrence of them taken out of the training lines."""
    if count < 1:
        raise ValueError(f"held-out documents: {count}; at least 1")
    distinct = [line for line in dict.fromkeys(lines) if line.strip()]
    if len(distinct) < 2 * count:  # most of the corpus stays for training
        raise ValueError(f"{count} held-out documents asked of a corpus of {len(distinct)} distinct lines")
    stride = len(distinct) // count
    stretches = (distinct[start : start + stride] for start in range(0, stride * count, stride))
    heldout = [line for line in (next(filter(fits, stretch), None) for stretch in stretches) if line is not None]
    if len(heldout) < count:
        raise ValueError(f"only {len(heldout)} of {count} stretches of the corpus have a line short enough to hold out")
    taken = set(heldout)
    return [line for line in lines if line not in taken], heldout


def heldout_loss(
    model: Any,
    tokenizer: Any,
    documents: Sequence[str],
    *,
    max_length: int = BLOCK,
    mlm_probability: float = 0.15,
    seed: int = EVAL_SEED,
    batch_size: int = 64,
) -> dict[str, Any]:
    """Masked-LM loss per masked token over ``documents``, each evaluated alone: a row holds one document, and a
    batch only documents of one length, so no row is padded or shares attention (the same as one forward per
    document, in fewer calls). Masks come from the job's collator (train/model/collator.py: 80/10/10, never a special
    token) seeded by (``seed``, 0, document index): every model is scored on the same positions."""
    import torch

    # Not at the top: these import datasets, which reads HF_HOME at import; bench.run imports this before use_local_hf.
    from train.data import SAMPLE_INDEX
    from train.model.collator import IGNORE_INDEX, MaskingCollator

    if not documents:
        raise ValueError("no held-out documents to evaluate")
    encoded = tokenizer(list(documents), return_special_tokens_mask=True, truncation=False, verbose=False)
    too_long = [i for i, ids in enumerate(encoded["input_ids"]) if len(ids) > max_length]
    if too_long:
        raise ValueError(f"{len(too_long)} held-out document(s) longer than {max_length} tokens (first: #{too_long[0]})"
                         ": they cannot be evaluated whole")  # fmt: skip
    collator = MaskingCollator(
        pad_token_id=tokenizer.pad_token_id, mask_token_id=tokenizer.mask_token_id, vocab_size=len(tokenizer),
        mlm_probability=mlm_probability, seed=seed, pad_to_multiple_of=None,
    )  # fmt: skip
    by_length: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for index, (ids, special) in enumerate(zip(encoded["input_ids"], encoded["special_tokens_mask"], strict=True)):
        by_length[len(ids)].append({"input_ids": ids, "special_tokens_mask": special, SAMPLE_INDEX: index})
    total, masked = 0.0, 0
    device = next(model.parameters()).device
    model.eval()
    with torch.inference_mode():
        for length in sorted(by_length):
            group = by_length[length]
            for start in range(0, len(group), batch_size):
                batch = {k: v.to(device) for k, v in collator(group[start : start + batch_size]).items()}
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
                chosen = batch["labels"] != IGNORE_INDEX
                targets = batch["labels"][chosen]
                loss = torch.nn.functional.cross_entropy(logits[chosen].float(), targets, reduction="sum")
                total += float(loss)
                masked += int(chosen.sum())
    if masked == 0:
        raise ValueError(f"no token of the {len(documents)} held-out document(s) was masked")
    return {
        "loss": total / masked,
        "masked_tokens": masked,
        "documents": len(documents),
        "tokens": sum(len(ids) for ids in encoded["input_ids"]),
    }
