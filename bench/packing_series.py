"""Runs the packing series (its settings, flags, held-out evaluation, summary and report: bench/packing.py): the
real series' corpus and tokenizer (bench/real_series.py), a training file without the held-out documents, each
mode's tokenization and layout, then the speed runs, repeat after repeat, and the quality runs, seed after seed,
each quality run's model scored on the held-out documents as soon as it is written.

Results: ``bench/results/<date>-<host>-packing.json`` and ``.md``, and ``bench/results/latest-packing.md``; written
after every run, so a time limit keeps what was measured. A mode whose run fails is reported with the failure and
left out of that architecture's later runs; the others go on.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import heads, packing, packing_report, real, report
from bench.real_series import prepare_real
from bench.runner import RunFailed, result_header, run_dir, run_once, write_results
from train.config import load_config
from train.outputs.runfiles import RunFiles

REFERENCE = "dynamic"  # the mode whose tokenization counts the corpus's tokens (one example per line, cut at 128)


def results_stem(stem: str) -> str:
    """The packing series' result files sit beside the other series' of the same run, told apart by the suffix."""
    return f"{stem}-packing"


def prepare_packing(settings: packing.PackingSettings, workdir: Path) -> tuple[Path, Path, list[str], dict[str, Any]]:
    """The real series' corpus and tokenizer (shared with its other series through the workdir), and the corpus
    less ``settings.heldout`` documents: (training file, tokenizer directory, held-out documents, corpus facts).
    The tokenizer was trained on the whole corpus: the held-out lines are 1 % of it, and what they lend it is
    vocabulary, not anything a model learns."""
    shared = real.RealSettings(settings.device, recipes=[], corpus_mb=settings.corpus_mb, threads=settings.threads)
    corpus, tokenizer_dir, facts = prepare_real(shared, workdir)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    lines = corpus.read_text(encoding="utf-8").splitlines()
    train_lines, heldout = packing.split_heldout(
        lines, settings.heldout, lambda line: len(tokenizer(line, verbose=False)["input_ids"]) <= packing.BLOCK
    )
    train_file = workdir / f"packing-train-{corpus.stem}-{settings.heldout}.txt"
    text = "\n".join(train_lines) + "\n"
    # Rewritten only when it changes: the job's tokenization cache is keyed by the file, and a reused workdir
    # should not tokenize again.
    if not train_file.exists() or train_file.read_text(encoding="utf-8") != text:
        train_file.write_text(text, encoding="utf-8")
    facts = {**facts, "training_file": train_file.name, "training_lines": len(train_lines)}
    return train_file, tokenizer_dir, heldout, facts


def tokenized_layout(argv: list[str], batch: int, samples: int) -> dict[str, Any]:
    """One mode's training split tokenized as its run will tokenize it (the cache filled: no timed run pays for
    it), and its layout: real tokens per example, the tokens it trains on and those truncation cut, and the
    efficiency as the job computes it (its collator's ``measure()``) over ``samples`` samples drawn at random, in
    batches of ``batch``: the Trainer shuffles, and neighbouring lines of a file have similar lengths, so batches
    of consecutive samples (the job's own 256) pad far less than the ones it trains on."""
    # Not at the top: these import datasets, which reads HF_HOME at import; prepare_real's use_local_hf sets it first.
    from train.data import Padding, load_raw, real_token_count, tokenize, truncation
    from train.model.collator import MaskingCollator
    from train.model.load import load_tokenizer, scratch_config

    config = load_config(argv, environ={})
    raw = load_raw(config.data, config.training)
    tokenizer = load_tokenizer(config.model, config.data, raw, scratch_config(config.model))
    split = tokenize(config.data, raw, tokenizer)["train"]
    padding = Padding(config.data.padding)  # the collator's padding as train/run/build.py sets it: the mode's rules
    collator = MaskingCollator(
        pad_token_id=tokenizer.pad_token_id, mask_token_id=tokenizer.mask_token_id, vocab_size=len(tokenizer),
        pad_to_multiple_of=padding.pad_multiple(config.data.pad_to_multiple_of), flatten=padding.flattens,
    )  # fmt: skip
    drawn = random.Random(real.SEED).sample(range(len(split)), min(samples, len(split)))
    sample = split.__getitems__(drawn)
    measured = collator.measure([sample[i : i + batch] for i in range(0, len(sample), batch)])
    tokens = real_token_count(split, tokenizer.pad_token_id)
    return {
        "batch": batch,
        "examples": len(split),
        "tokens_per_example": tokens / len(split),
        "train_tokens": tokens,
        "tokens_cut": truncation(split)["tokens_cut"],
        "efficiency": measured["efficiency"],
        "samples": len(sample),
    }


def layouts(
    settings: packing.PackingSettings, corpus: Path, tokenizer_dir: Path
) -> tuple[dict[str, Any], dict[str, int]]:
    """Each mode's layout and its examples per step (from the corpus's real tokens per example, so that every mode
    gets as many real tokens a step), with the share of the corpus's tokens it trains on."""
    name = settings.architectures[0]  # the tokenization is the same for every architecture: one tokenizer
    flags = {
        mode: packing.run_flags(name, mode, settings, str(corpus), str(tokenizer_dir), settings.blocks)
        for mode in dict.fromkeys([REFERENCE, *settings.modes])
    }
    reference = tokenized_layout(flags[REFERENCE], settings.blocks, 1)
    batches = {m: packing.examples_per_step(m, settings, reference["tokens_per_example"]) for m in settings.modes}
    corpus_tokens = reference["train_tokens"] + reference["tokens_cut"]  # every line whole, specials included
    facts = {}
    for mode in settings.modes:
        layout = tokenized_layout(flags[mode], batches[mode], settings.measured_samples)
        facts[mode] = {**layout, "tokens_kept": layout["train_tokens"] / corpus_tokens}
    return facts, batches


def run_json_packing(workdir: Path, label: str) -> dict[str, Any] | None:
    """The job's own packing facts (run.json's ``packing``: the banner's efficiency) of a finished run."""
    path = RunFiles(run_dir(workdir, label) / "output").run_json
    return json.loads(path.read_text(encoding="utf-8")).get("packing") if path.exists() else None


def score_heldout(workdir: Path, label: str, tokenizer: Any, documents: list[str]) -> dict[str, Any]:
    """The held-out loss of the model a quality run wrote (its final/), on the GPU when there is one."""
    import torch
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(str(RunFiles(run_dir(workdir, label) / "output").final))
    if torch.cuda.is_available():
        model = model.to("cuda")
    return packing.heldout_loss(model, tokenizer, documents)


def run_packing_series(
    settings: packing.PackingSettings, workdir: Path, results_dir: Path, stem: str, tagged: bool
) -> None:
    """The layouts, then the speed runs repeat after repeat and the quality runs seed after seed; the results
    written after every run, the report printed at the end."""
    packing.check(settings)
    log = report.progress
    log(
        f"bench packing: {settings.device}, {'/'.join(settings.architectures)} at the {settings.size} size; speed: "
        f"{settings.repeats} x {'/'.join(settings.modes)}, {settings.max_steps} steps; quality: {settings.seeds} "
        f"seed(s) x {packing.ISOLATED}/{packing.CROSSING}, {settings.quality_steps} steps; in {workdir}"
    )
    corpus, tokenizer_dir, heldout, corpus_facts = prepare_packing(settings, workdir)
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    if settings.threads:  # the evaluation in this process takes no more of the machine than a run
        torch.set_num_threads(settings.threads)
    layout, batches = layouts(settings, corpus, tokenizer_dir)
    for mode, facts in layout.items():
        log(f"layout {mode}: {facts['batch']:,} examples a step, efficiency {facts['efficiency']:.1%}, "
            f"tokens kept {facts['tokens_kept']:.1%}")  # fmt: skip
    held = tokenizer(heldout, verbose=False)["input_ids"]
    context = {
        **result_header(asdict(settings)),
        "corpus": corpus_facts,
        "tokenizer_vocab": len(tokenizer),
        "heldout": {"documents": len(heldout), "tokens": sum(map(len, held)), "eval_seed": packing.EVAL_SEED},
        "architectures": {name: heads.config_overrides(name, settings.size) for name in settings.architectures},
        "layout": layout,
        "flags": packing.describe_flags(settings),
        "failures": [],
        "tagged": tagged,
    }
    runs: list[dict[str, Any]] = []
    quality: list[dict[str, Any]] = []
    failed: set[tuple[str, str]] = set()

    def measure(name: str, mode: str, label: str, argv: list[str], **keys: Any) -> dict[str, Any] | None:
        try:
            run = run_once(mode, argv, workdir, label, device=settings.device, threads=settings.threads)
        except RunFailed as exc:  # one mode's failure must not cost the others' figures
            failed.add((name, mode))
            context["failures"].append({"architecture": name, "mode": mode, "label": label, "error": str(exc)})
            log(f"packing {label} failed; {name} {mode} is left out of the later runs: {exc}")
            return None
        run.update(architecture=name, packing=run_json_packing(workdir, label), **keys)
        return run

    def write() -> str:
        result = {**context, "runs": runs, "quality_runs": quality,
                  "summary": packing_report.summarise(runs, quality, layout, settings)}  # fmt: skip
        markdown = packing_report.markdown(result)
        write_results(results_dir, results_stem(stem), result, markdown, None if tagged else "latest-packing.md")
        return markdown

    markdown = write()
    for rep, name, mode in packing.speed_schedule(settings):
        if (name, mode) in failed:
            continue
        argv = packing.run_flags(name, mode, settings, str(corpus), str(tokenizer_dir), batches[mode])
        run = measure(name, mode, f"packing-{rep}-{name}-{mode}", argv, rep=rep)
        if run is not None:
            runs.append(run)
            log(packing_report.run_line(run))
            markdown = write()
    for seed, name, mode in packing.quality_schedule(settings):
        if (name, mode) in failed:
            continue
        argv = packing.run_flags(name, mode, settings, str(corpus), str(tokenizer_dir), batches[mode], seed=seed)
        label = f"packing-seed{seed}-{name}-{mode}"
        run = measure(name, mode, label, argv, seed=seed, rep=seed)
        if run is not None:
            run["heldout"] = score_heldout(workdir, label, tokenizer, heldout)
            quality.append(run)
            log(packing_report.run_line(run))
            markdown = write()
    print(markdown)
    log(f"bench packing: results in {results_dir / results_stem(stem)}.json and .md")
