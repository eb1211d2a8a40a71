"""Streaming corpora (``streaming: true``): read, tokenize and pack on the fly while training, each rank its own
part of the stream, and resume a preempted run where its stream stopped.

The in-memory path (train/data.py) tokenizes the whole corpus into an Arrow cache first, which is right up to a
few GB. A stream reads the files (local or remote, compressed or not) as a ``datasets.IterableDataset``: nothing
is cached, memory stays flat however large the corpus, and the first step comes after one batch, not after the
whole corpus. What it costs: ``max_steps`` must be given (a stream has no length), examples come in file order
(shuffle the corpus beforehand; a shuffle buffer's content is not saved with a checkpoint, so it would break exact
resume), and evaluation uses a bounded set: ``validation_file``, or the first ``max_eval_samples`` examples of the
stream, held out from training (by their text: a line that also occurs later is left out there too).

Each rank reads its own part (``datasets.distributed.split_dataset_by_node``: whole files when their count divides
by the world size, else every world-size-th example), so no example is trained twice per pass and no rank waits
for another's preprocessing. The position of every rank's stream is saved with each checkpoint: the Trainer
itself only knows how to resume a stream by reading and throwing away every batch before the checkpoint
(``skip_first_batches``), which re-reads and re-tokenizes the corpus up to there; torchdata's StatefulDataLoader
records where each rank's reader (its DataLoader workers included) stands, and the Trainer saves none of it, so
StreamPosition does.
"""

from __future__ import annotations

import hashlib
import itertools
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import torch.distributed as dist
from datasets import Dataset, DatasetDict, IterableDataset
from datasets.distributed import split_dataset_by_node
from transformers import TrainerCallback

from train.config import Config
from train.data import (
    DEMO_SENTENCE,
    SAMPLE_INDEX,
    RawData,
    encode_texts,
    group_texts,
    is_remote,
    load_local,
    shown_url,
    source_files,
)
from train.errors import ConfigError
from train.hf import looks_local, offline_hint

STATE_FILE = "stream_state.pt"  # in each checkpoint: every rank's data loader position
TOKENIZER_SAMPLE = 100_000  # examples of the stream a tokenizer trained from scratch learns from
DEMO_SHARDS = 4  # the demo stream's files, so that it splits across ranks by whole shards


def open_stream(config: Config) -> tuple[IterableDataset, str]:
    """The training corpus as a stream of ``text_column`` strings, and a fingerprint naming the source."""
    job = config.job
    label = config.source_of("dataset")
    if job.dataset == "demo":
        rows = Dataset.from_dict({job.text_column: [DEMO_SENTENCE] * job.demo_samples})
        return rows.to_iterable_dataset(num_shards=DEMO_SHARDS), f"demo-{job.demo_samples}"
    if is_remote(job.dataset) or looks_local(job.dataset):
        builder, files = source_files(job.dataset, label)
        if any(f.startswith(("s3://", "s3a://")) for f in files):
            s3_ignores_http_client_options()
        stream = datasets.load_dataset(builder, data_files=files, split="train", streaming=True)
        fingerprint = hashlib.sha256(repr([builder, [shown_url(f) for f in files]]).encode()).hexdigest()[:16]
    else:
        try:
            stream = datasets.load_dataset(job.dataset, job.dataset_config_name, split="train", streaming=True)
        except Exception as exc:  # noqa: BLE001 - network, offline mode, unknown id
            hint = offline_hint("dataset", "MLM_DATASET")
            raise ConfigError(f"{label}={job.dataset!r}: cannot stream the hub dataset ({hint})") from exc
        fingerprint = hashlib.sha256(repr([job.dataset, job.dataset_config_name]).encode()).hexdigest()[:16]
    return _text_only(stream, label, job.dataset, job.text_column), fingerprint


def s3_ignores_http_client_options() -> None:
    """Let s3fs read the compressed files of a stream. datasets' decompressing filesystems hand aiohttp's
    ``client_kwargs`` (``requote_redirect_url``, ``trust_env``) to whichever filesystem holds the file, and s3fs
    passes them on to aiobotocore, which rejects them (huggingface/datasets issue 7295, open): s3:// is served by an
    S3FileSystem that drops those two, meaningless for S3. Registered for this process and its DataLoader workers."""
    import fsspec
    import s3fs

    class S3FileSystem(s3fs.S3FileSystem):  # type: ignore[misc]
        def __init__(self, *args: Any, client_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
            kept = {k: v for k, v in (client_kwargs or {}).items() if k not in ("requote_redirect_url", "trust_env")}
            super().__init__(*args, client_kwargs=kept, **kwargs)

    for protocol in ("s3", "s3a"):
        fsspec.register_implementation(protocol, S3FileSystem, clobber=True)


def _text_only(stream: IterableDataset, label: str, source: str, column: str) -> IterableDataset:
    """The stream's ``column``; its first example is read now, so a wrong column or an unreadable file is a clear
    error before the ranks start training. Rows whose text is not a string are dropped later, in TextStream.keep."""
    try:
        first = next(iter(stream.take(1)), None)
    except Exception as exc:  # noqa: BLE001 - parser, credentials, network: the reader's first line says which
        cause = exc.__cause__ or exc
        line = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:200]
        raise ConfigError(f"{label}={shown_url(source)!r}: cannot be read ({line})") from None
    if first is None:
        raise ConfigError(f"{label}={shown_url(source)!r}: no examples")
    if column not in first:
        raise ConfigError(
            f"{label}={shown_url(source)!r}: no column {column!r} (columns: {', '.join(first)}); set MLM_TEXT_COLUMN"
        )
    return stream.select_columns([column])


@dataclass(frozen=True)
class TextStream:
    """The training corpus as a stream of ``column`` rows, and the texts held out of it for evaluation. The rows
    are filtered (``keep``) in the same batched step that tokenizes them: every further batched layer of an
    IterableDataset joins its batch's keys into a new string, which cost 70 % of the stream's time with four."""

    rows: IterableDataset
    column: str
    held_out: frozenset[str] = frozenset()

    def keep(self, texts: list[Any]) -> list[str]:
        """The texts to train on: strings (null and non-string rows dropped) not held out for evaluation."""
        return [text for text in texts if isinstance(text, str) and text not in self.held_out]

    def texts(self) -> Iterator[str]:
        for batch in self.rows.iter(batch_size=1000):
            yield from self.keep(batch[self.column])


def load_stream_raw(config: Config) -> tuple[TextStream, RawData]:
    """The training stream, and (as RawData, the in-memory path's shape) the evaluation examples plus, when a
    tokenizer is trained from scratch, a bounded sample of the stream for it to learn from."""
    job = config.job
    rows, fingerprint = open_stream(config)
    stream = TextStream(rows, job.text_column)
    splits: dict[str, Dataset] = {}
    if job.validation_file:
        evaluation = load_local(job.validation_file, config.source_of("validation_file"), job.text_column)
        if job.max_eval_samples:
            evaluation = evaluation.select(range(min(job.max_eval_samples, len(evaluation))))
        splits["validation"] = evaluation
        fingerprint += "-" + evaluation._fingerprint
    elif job.max_eval_samples:
        # The first examples of the stream are held out. Training leaves them out by their text: skip(n) would be
        # split among the ranks' shards, skipping other examples on every rank but the first.
        splits["validation"] = _materialize(stream, job.max_eval_samples)
        stream = replace(stream, held_out=frozenset(splits["validation"][job.text_column]))
    elif config.training.eval_strategy != "no":
        raise ConfigError(
            f"{config.source_of('streaming')}=true: a stream has no validation split to hold out; set "
            "max_eval_samples (the first examples of the stream are held out), validation_file, or eval_strategy no"
        )
    fingerprint += f"-{job.max_eval_samples}"
    if job.max_train_samples:
        stream = replace(stream, rows=stream.rows.take(job.max_train_samples))
    splits["train"] = _materialize(stream, TOKENIZER_SAMPLE)  # for a tokenizer trained from scratch
    return stream, RawData(splits=DatasetDict(splits), fingerprint=f"stream-{fingerprint}")


def _materialize(stream: TextStream, count: int) -> Dataset:
    """The first ``count`` texts of the stream, in memory."""
    return Dataset.from_dict({stream.column: list(itertools.islice(stream.texts(), count))})


def content_index(input_ids: list[int]) -> int:
    """A stream example's ``sample_index`` (what the collator keys its masks on): a hash of its tokens. Positions
    would repeat across DataLoader workers, each of which counts its own files; content does not depend on who
    reads it or when, so a resumed run masks every example as an uninterrupted one would."""
    digest = hashlib.blake2b(np.asarray(input_ids, dtype=np.int64).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # non-negative int64


def tokenized_stream(config: Config, stream: TextStream, tokenizer: Any, rank: int, world_size: int) -> IterableDataset:
    """Rank ``rank``'s part of the stream, filtered, tokenized (and packed) on the fly in one batched step, each
    example with its sample index."""
    job = config.job
    mine = split_dataset_by_node(stream.rows, rank=rank, world_size=world_size)

    def prepare(texts: list[Any]) -> dict[str, Any]:
        encoded = encode_texts(tokenizer, stream.keep(texts), job, count_cut=False)  # a stream's cuts are not counted
        if job.padding == "packed":
            encoded = group_texts(encoded, job.max_seq_length)
        return {**encoded, SAMPLE_INDEX: [content_index(ids) for ids in encoded["input_ids"]]}

    return mine.map(prepare, batched=True, input_columns=[stream.column], remove_columns=[stream.column])


def stream_loader(dataset: IterableDataset, trainer: Any) -> Any:
    """A StatefulDataLoader over this rank's stream, with the Trainer's batch size, collator and workers. Not
    passed through accelerate's prepare, which would split the stream across ranks a second time."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    # torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates: a warning per loader, ours to silence.
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
    args = trainer.args
    workers = min(args.dataloader_num_workers, max(dataset.num_shards, 1))  # a worker per file at most
    return StatefulDataLoader(
        dataset,
        batch_size=trainer._train_batch_size,
        collate_fn=trainer.data_collator,
        num_workers=workers,
        pin_memory=args.dataloader_pin_memory,
        prefetch_factor=args.dataloader_prefetch_factor if workers else None,
        persistent_workers=args.dataloader_persistent_workers and workers > 0,
        # Its own generator: a DataLoader draws its workers' base seed when an iterator starts, from the global
        # RNG by default, which would shift a resumed run's dropout off the uninterrupted run's (the Trainer
        # restores the RNG state before it starts the iterator).
        generator=torch.Generator().manual_seed(args.seed),
    )


class StreamPosition(TrainerCallback):
    """Saves every rank's stream position into each checkpoint (``stream_state.pt``), before the checkpoint is
    marked complete; ``load`` reads this rank's back for a resumed run. Every rank calls ``on_save`` (the Trainer
    saves on all of them), rank 0 gathers the positions and writes the file."""

    def on_save(self, args: Any, state: Any, control: Any, train_dataloader: Any = None, **kwargs: Any) -> None:
        position = train_dataloader.state_dict() if hasattr(train_dataloader, "state_dict") else None
        positions = [position]
        if dist.is_available() and dist.is_initialized():
            positions = [None] * dist.get_world_size()
            dist.all_gather_object(positions, position)
        if args.process_index == 0:
            checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if checkpoint.is_dir():
                tmp = checkpoint / (STATE_FILE + ".tmp")
                torch.save({"world_size": len(positions), "ranks": positions}, tmp)
                tmp.replace(checkpoint / STATE_FILE)

    @staticmethod
    def load(checkpoint: str, rank: int, world_size: int, option: str) -> dict[str, Any] | None:
        """This rank's saved position in ``checkpoint``, or None when it holds none (saved before streaming)."""
        path = Path(checkpoint) / STATE_FILE
        if not path.exists():
            return None
        saved = torch.load(path, weights_only=False)
        if saved["world_size"] != world_size:
            raise ConfigError(
                f"{option}=true: {Path(checkpoint).name} holds the stream positions of {saved['world_size']} "
                f"rank(s), this run has {world_size}: resume with {saved['world_size']}, or start over with "
                "MLM_RESUME=never"
            )
        return saved["ranks"][rank]
