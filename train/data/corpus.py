"""The data a rank trains on, as one value: :func:`build_corpus` tokenizes what :func:`train.data.load_raw` read,
the whole corpus (cached) or, for a stream, this rank's part on the fly, and says what is known of it beforehand.
The job then builds its Trainer from a :class:`Corpus` without asking whether the corpus is a stream."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from datasets import DatasetDict, IterableDataset

from train.common.console import warn
from train.common.distributed import gather_from_every_rank, is_world_zero
from train.common.errors import ConfigError
from train.config import DataArguments
from train.data.mixture import MixedSource, mix
from train.data.raw import RawData
from train.data.stream import tokenized_stream
from train.data.tokenization import IndexedExamples, joined, real_token_count, tokenize, truncation


@dataclass(frozen=True)
class Corpus:
    """Tokenized training and evaluation data, and the facts the logs and run.json report. What a stream's size
    and truncation are is not known before it is read: those facts are None for one."""

    train: IndexedExamples | IterableDataset
    validation: IndexedExamples | None
    fingerprint: str  # names the raw data (run.json's dataset_fingerprint)
    streaming: bool
    train_samples: int | None
    eval_samples: int
    train_real_tokens: int | None
    truncation: dict[str, int] | None  # examples_cut, tokens_cut
    # The text's rows (documents or lines) the examples came from: what max_train_samples and max_eval_samples
    # count; packing cuts them into other numbers of blocks (train None for a stream).
    train_documents: int | None = None
    eval_documents: int = 0
    # A stream's part for any (rank, world size): a run resumed on another number of ranks rebuilds the old ranks'
    # parts (train/data/stream_resume.py). None for a tokenized corpus.
    stream_part: Callable[[int, int], IterableDataset] | None = None
    cached: bool | None = None  # the training split read from the tokenized cache (None: a stream, tokenized as read)
    # A mixture's held-out part per source (its key: eval_<key>_loss) and what the epoch takes of each source.
    validation_parts: dict[str, IndexedExamples] | None = None
    mixture: list[MixedSource] | None = None


def build_corpus(data: DataArguments, raw: RawData, tokenizer: Any, rank: int, world_size: int, seed: int) -> Corpus:
    """``raw`` tokenized the way ``data`` says for rank ``rank`` of ``world_size`` (a mixture's sources mixed in the
    order ``seed`` draws: the run's). Call it where load_raw is called, inside the Trainer's main_process_first: the
    first rank fills the tokenization cache that the others then read."""
    if raw.stream is not None:  # tokenized on the fly; only the bounded evaluation set is tokenized now
        held_out = DatasetDict({k: v for k, v in raw.splits.items() if k == "validation"})
        validation = tokenize(data, RawData(held_out, raw.fingerprint), tokenizer).get("validation")
        return Corpus(
            train=tokenized_stream(data, raw.stream, tokenizer, rank, world_size),
            validation=validation,
            fingerprint=raw.fingerprint,
            streaming=True,
            train_samples=None,
            eval_samples=len(validation) if validation is not None else 0,
            train_real_tokens=None,
            truncation=None,
            eval_documents=len(held_out["validation"]) if "validation" in held_out else 0,
            stream_part=functools.partial(tokenized_stream, data, raw.stream, tokenizer),
        )
    if raw.parts is not None:
        train, validation, parts, facts, cut = mixed_splits(data, raw, tokenizer, seed)
        real_tokens = sum(fact.tokens for fact in facts)
    else:
        splits = tokenize(data, raw, tokenizer)
        train, validation, parts, facts = splits["train"], splits.get("validation"), None, None
        real_tokens, cut = real_token_count(train, tokenizer.pad_token_id), truncation(train)
    corpus = Corpus(
        train=train,
        validation=validation,
        fingerprint=raw.fingerprint,
        streaming=False,
        train_samples=len(train),
        eval_samples=len(validation) if validation is not None else 0,
        train_real_tokens=real_tokens,
        truncation=cut,
        train_documents=len(raw.splits["train"]),
        eval_documents=len(raw.splits["validation"]) if "validation" in raw.splits else 0,
        cached=train.cached,
        validation_parts=parts,
        mixture=facts,
    )
    if is_world_zero():  # every rank counts the same cuts; one says so
        warn_truncation(corpus, data.max_seq_length)
    return corpus


def mixed_splits(
    data: DataArguments, raw: RawData, tokenizer: Any, seed: int
) -> tuple[
    IndexedExamples, IndexedExamples | None, dict[str, IndexedExamples] | None, list[MixedSource], dict[str, int]
]:
    """A mixture's sources tokenized (and packed) each alone, then mixed by their token shares
    (train/data/mixture.py, in the order ``seed`` draws): the training set, the held-out parts together and apart
    (for a loss per source), what the epoch takes of each source, and what truncation cut of the sources' examples
    (counted on each source's own table, not on the mixed selection, which Arrow would copy whole to read)."""
    assert raw.parts is not None
    tokenized = [(part, tokenize(data, part_raw, tokenizer)) for part, part_raw in raw.parts]
    mixed, facts = mix(
        [(part, splits["train"]) for part, splits in tokenized], data.mixture_exhausted, seed, tokenizer.pad_token_id
    )
    train = IndexedExamples(mixed, cached=all(splits["train"].cached for _, splits in tokenized))
    held_out = {part.key: splits["validation"] for part, splits in tokenized if "validation" in splits}
    validation = joined(held_out.values()) if held_out else None
    cuts = [truncation(splits["train"]) for _, splits in tokenized]
    cut = {key: sum(c[key] for c in cuts) for key in ("examples_cut", "tokens_cut")}
    return train, validation, held_out or None, facts, cut


def warn_truncation(corpus: Corpus, max_seq_length: int) -> None:
    """Say how much of the training text truncation dropped, and how to train on all of it."""
    cut = corpus.truncation
    if not cut or not cut["examples_cut"]:
        return
    kept = corpus.train_real_tokens or 0
    share = 100 * cut["tokens_cut"] / max(kept + cut["tokens_cut"], 1)
    examples = corpus.train_documents or corpus.train_samples  # a mixture's sources' own, repeats not counted
    warn(
        f"{cut['examples_cut']:,} of {examples:,} training examples are longer than "
        f"max_seq_length={max_seq_length} and were cut, dropping {cut['tokens_cut']:,} tokens ({share:.1f} % "
        "of the text): use padding packed, or a larger max_seq_length, to train on all of it"
    )


def check_stream_parts(data: DataArguments, corpus: Corpus) -> None:
    """Refuse, on every rank at once and before the model is built, a stream that leaves some rank nothing to
    train on: all of it held out or without text, or fewer examples than ranks (each of N ranks reads every N-th
    example, or whole files when their number divides by N). Alone, the Trainer would only warn and end its epoch
    at step 0; beside others, that rank would stop while they wait for it in their gradient all-reduce until
    ddp_timeout, then crash with "connection closed by peer". Each rank reads its part's first example (the
    stream's own first was read when it was opened); a collective: every rank calls it, outside
    main_process_first."""
    if not corpus.streaming:
        return
    ranks = gather_from_every_rank(next(iter(corpus.train), None) is not None)
    empty = [rank for rank, has in enumerate(ranks) if not has]
    if empty:
        raise no_training_example(data, empty, len(ranks))


def no_training_example(data: DataArguments, empty: list[int], world_size: int) -> ConfigError:
    """The one-line error for a stream that gives ranks ``empty`` of ``world_size`` nothing to train on."""
    if world_size == 1:
        what = "the training stream gave no example"
    else:
        ranks = ", ".join(str(rank) for rank in empty)
        what = (
            f"the training stream gives rank(s) {ranks} of {world_size} no example (each of N ranks reads every "
            "N-th example, or whole files when their number divides by N)"
        )
    why = ""
    if data.max_eval_samples and not data.validation_file:
        why = (
            f": {data.source_of('max_eval_samples')}={data.max_eval_samples} holds out the stream's first "
            f"{data.max_eval_samples:,} examples, and every other line with the same text"
        )
    fewer = ", or fewer ranks" if world_size > 1 else ""
    return ConfigError(
        f"{data.source_of('streaming')}=true: {what}{why}; final/ was not written (a smaller max_eval_samples, "
        f"a validation_file, or more data{fewer})"
    )
