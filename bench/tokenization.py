"""``python -m bench.tokenization [job options]``: tokenize the configured data the way the job does; print JSON.

bench/demo_series.py starts this twice with the same empty cache (HF_HOME): the first process tokenizes, the
second must find every split in the cache. Separate processes, because a second run of the job is a new process:
the time covers ``train.data.tokenize`` alone, not imports or loading the tokenizer.
"""

from __future__ import annotations

import json
import sys
import time

from train.common.hf import cache_root
from train.config import load_config
from train.data import load_raw, tokenize
from train.model.load import load_tokenizer, scratch_config


def main(argv: list[str]) -> int:
    config = load_config(argv, environ={})
    raw = load_raw(config.data, config.training)
    tokenizer = load_tokenizer(config.model, config.data, raw, scratch_config(config.model))
    directory = cache_root() / "tokenized"
    before = {p.name: p.stat().st_mtime_ns for p in directory.glob("*.arrow")} if directory.exists() else {}
    started = time.perf_counter()
    splits = tokenize(config.data, raw, tokenizer)
    seconds = time.perf_counter() - started
    after = {p.name: p.stat().st_mtime_ns for p in directory.glob("*.arrow")}
    record = {
        "seconds": seconds,
        "samples": sum(len(split) for split in splits.values()),
        "cache_files_before": len(before),
        # A hit reads the files the first run wrote and writes none: no new name, no changed modification time.
        "files_written": sorted(name for name, stamp in after.items() if before.get(name) != stamp),
    }
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
