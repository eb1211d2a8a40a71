"""``make bench-data``: preprocessing as the corpus grows, ours against transformers' run_mlm.py recipe.

The same real text (bench/corpus.py) at three sizes; for each, in fresh processes with an empty cache: our
tokenize + pack (``padding: packed``) with one process and with one per CPU, the run_mlm.py recipe (``map`` of the
tokenizer, then ``group_texts`` with ``itertools.chain``, one process), and our stream read to its end. Reported:
seconds, peak RSS, cache size, and the growth ratios (linear means the 4x corpus takes about 4x the time).
Not a test: timings depend on the machine; results go to bench/results/.

Usage: python -m bench.data [--sizes 20,100,400] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

from bench.corpus import write_corpus
from bench.grouping import group_texts

MODES = ("ours-1", "ours-all", "run_mlm", "stream")
BLOCK = 128
TOKENIZER_SAMPLE_MB = 8


def cache_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*.arrow")) if root.exists() else 0


def worker(mode: str, corpus: Path, tokenizer_dir: Path, hf_home: Path) -> dict[str, Any]:
    """One measurement, in this (fresh) process."""
    os.environ["HF_HOME"] = str(hf_home)
    from transformers import AutoTokenizer

    # After HF_HOME above, not at the top: train.config imports huggingface_hub, which reads HF_HOME at import.
    from train.config import load_config

    # After HF_HOME: train.data imports datasets, whose config takes its cache paths from HF_HOME at import.
    from train.data import load_raw, tokenize, tokenized_stream

    workers = {"ours-1": "1", "ours-all": str(len(os.sched_getaffinity(0)))}.get(mode, "1")
    env = {
        "MLM_DATASET": str(corpus),
        "MLM_TOKENIZER_NAME": str(tokenizer_dir),
        "MLM_PADDING": "packed",
        "MLM_MAX_SEQ_LENGTH": str(BLOCK),
        "MLM_VALIDATION_SPLIT_PERCENTAGE": "1",
        "MLM_PREPROCESSING_NUM_WORKERS": workers,
        "MLM_MAX_STEPS": "1",
    }
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    streamed = {**env, "MLM_STREAMING": "true", "MLM_MAX_EVAL_SAMPLES": "100"}
    config = load_config([], streamed if mode == "stream" else env)  # outside the timing: imports, arguments
    started = time.perf_counter()
    if mode.startswith("ours"):
        splits = tokenize(config.data, load_raw(config.data, config.training), tokenizer)
        blocks = sum(len(split) for split in splits.values())
    elif mode == "run_mlm":
        blocks = run_mlm_recipe(corpus, tokenizer, hf_home)
    else:
        stream = load_raw(config.data, config.training).stream
        assert stream is not None  # MLM_STREAMING=true
        blocks = sum(1 for _ in tokenized_stream(config.data, stream, tokenizer, 0, 1))
    seconds = time.perf_counter() - started
    return {
        "mode": mode,
        "seconds": seconds,
        "blocks": blocks,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cache_mib": cache_bytes(hf_home) / 2**20,
    }


def run_mlm_recipe(corpus: Path, tokenizer: Any, hf_home: Path) -> int:
    """transformers examples/pytorch/language-modeling/run_mlm.py, not line_by_line: tokenize every line, then
    concatenate and cut into max_seq_length blocks (its group_texts), one process, cached as it caches."""
    import datasets

    raw = datasets.load_dataset("text", data_files={"train": str(corpus)}, cache_dir=str(hf_home / "raw"))
    tokenized = raw.map(
        lambda examples: tokenizer(examples["text"], return_special_tokens_mask=True),
        batched=True,
        remove_columns=["text"],
    )
    grouped = tokenized.map(group_texts, batched=True, fn_kwargs={"block": BLOCK})
    return sum(len(split) for split in grouped.values())


def measure(mode: str, corpus: Path, tokenizer_dir: Path, workdir: Path) -> dict[str, Any]:
    hf_home = workdir / f"hf-{mode}-{corpus.stem}"
    subprocess.run(["rm", "-rf", str(hf_home)], check=True)
    command = [sys.executable, "-m", "bench.data", "--worker", mode, str(corpus), str(tokenizer_dir), str(hf_home)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench.data {mode} {corpus.name}: failed\n{done.stderr[-3000:]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    subprocess.run(["rm", "-rf", str(hf_home)], check=True)
    return record


def train_tokenizer(corpus: Path, directory: Path) -> Path:
    if (directory / "tokenizer.json").exists():
        return directory
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train([str(corpus)], trainers.WordPieceTrainer(vocab_size=30522, special_tokens=special))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", model_max_length=BLOCK,
    ).save_pretrained(str(directory))  # fmt: skip
    return directory


def table(results: list[dict[str, Any]], sizes: list[int]) -> str:
    rows = [
        "| corpus | mode | seconds | blocks | peak RSS MiB | cache MiB | cache per GB of text |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        per_gb = r["cache_mib"] / 1024 / (r["size_mb"] / 1024) if r["cache_mib"] else 0.0
        rows.append(
            f"| {r['size_mb']} MB | {r['mode']} | {r['seconds']:.1f} | {r['blocks']:,} | {r['peak_rss_mib']:,.0f} | "
            f"{r['cache_mib']:,.0f} | {per_gb:.2f} GB |"
        )
    rows += [
        "",
        f"| mode | time x{sizes[-1] // sizes[-2]} corpus ({sizes[-2]} -> {sizes[-1]} MB) | RSS ratio |",
        "|---|---|---|",
    ]
    for mode in MODES:
        small = next(r for r in results if r["mode"] == mode and r["size_mb"] == sizes[-2])
        large = next(r for r in results if r["mode"] == mode and r["size_mb"] == sizes[-1])
        time_ratio = large["seconds"] / small["seconds"]
        rows.append(f"| {mode} | {time_ratio:.2f}x | {large['peak_rss_mib'] / small['peak_rss_mib']:.2f}x |")
    ours = {r["size_mb"]: r for r in results if r["mode"] == "ours-1"}
    recipe = {r["size_mb"]: r for r in results if r["mode"] == "run_mlm"}
    rows += ["", "| corpus | run_mlm recipe / ours (one process), time |", "|---|---|"]
    rows += [f"| {s} MB | {recipe[s]['seconds'] / ours[s]['seconds']:.2f}x |" for s in sizes]
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20,100,400", help="corpus sizes in MB, smallest first")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/mlm-bench-data"))
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--worker", nargs=4, metavar=("MODE", "CORPUS", "TOKENIZER", "HF_HOME"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        mode, corpus, tokenizer_dir, hf_home = args.worker
        print(json.dumps(worker(mode, Path(corpus), Path(tokenizer_dir), Path(hf_home))))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    if len(sizes) < 2 or sizes != sorted(set(sizes)):
        parser.error(f"--sizes {args.sizes}: expected two or more sizes in MB, smallest first (it measures growth)")
    args.workdir.mkdir(parents=True, exist_ok=True)
    sample = write_corpus(args.workdir / f"corpus-{TOKENIZER_SAMPLE_MB}mb.txt", TOKENIZER_SAMPLE_MB * 2**20)
    tokenizer_dir = train_tokenizer(sample, args.workdir / "tokenizer")
    results = []
    for size in sizes:
        corpus = write_corpus(args.workdir / f"corpus-{size}mb.txt", size * 2**20)
        for mode in MODES:
            record = {**measure(mode, corpus, tokenizer_dir, args.workdir), "size_mb": size}
            print(json.dumps(record), flush=True)
            results.append(record)
    text = f"# Data preprocessing benchmark ({date.today()}, {len(os.sched_getaffinity(0))} CPUs)\n\n"
    text += "`python -m bench.data --sizes " + args.sizes + "` (bench/data.py)\n\n" + table(results, sizes)
    args.results.mkdir(parents=True, exist_ok=True)
    stem = args.results / f"{date.today()}-data"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    stem.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
