"""``entrypoint.sh prepare [--option value ...]``: read and tokenize the configured corpus into the cache, apart
from (and before) the training job, then exit.

Inside the job, rank 0 tokenizes while every other rank waits for it in a collective whose timeout is
``ddp_timeout`` (30 minutes by default; transformers issue 17106): a corpus that takes longer to tokenize ends
the job with a timeout. Run ``prepare`` first, with the job's options, as a Kubernetes init container, a separate
Job or a step of an sbatch script, writing the cache to the shared volume the job's ``HF_HOME`` points at: then
the job's ranks, on every node, find their tokenized data in the cache and start at once. One process, no
torch.distributed; tokenization uses the CPUs this container is given (``preprocessing_num_workers``).
"""

from __future__ import annotations

import os
import time

from train.commands.start import start
from train.common.console import say
from train.common.distributed import run_and_exit
from train.common.hf import cache_root
from train.common.writable import check_cache_dir
from train.config import Config
from train.data import build_corpus, load_raw, real_token_count
from train.model.load import load_tokenizer, scratch_config


def directory_bytes(path: os.PathLike[str] | str) -> int:
    return sum(entry.stat().st_size for entry in os.scandir(path) if entry.is_file(follow_symlinks=False))


def main(argv: list[str] | None = None) -> int:
    return start("prepare", prepared, argv, console=False)


def prepared(config: Config) -> int:
    """Tokenize the corpus into the cache and say what it holds; nothing for a stream."""
    check_cache_dir()
    if config.data.streaming:
        say("streaming: nothing to prepare; a stream is read and tokenized while training")
        return 0
    started = time.monotonic()
    raw = load_raw(config.data, config.training)
    tokenizer = load_tokenizer(config.model, config.data, raw, scratch_config(config.model))
    # One process tokenizing for every rank of the later job: the cache key does not depend on the rank.
    corpus = build_corpus(config.data, raw, tokenizer, rank=0, world_size=1, seed=config.training.seed)
    cache = cache_root() / "tokenized"
    counts = f"train {corpus.train_samples:,} examples ({corpus.train_real_tokens:,} tokens)"
    if corpus.validation is not None:
        tokens = real_token_count(corpus.validation, tokenizer.pad_token_id)
        counts += f", validation {corpus.eval_samples:,} examples ({tokens:,} tokens)"
    say(
        f"prepared in {time.monotonic() - started:.1f} s: {counts}; cache {cache} "
        f"({directory_bytes(cache) / 2**20:,.1f} MiB in all)"
    )
    return 0


if __name__ == "__main__":
    run_and_exit(main)
