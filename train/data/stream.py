"""Streaming corpora (``streaming: true``): read, tokenize and pack on the fly while training, each rank its own
part of the stream, and resume a preempted run where its stream stopped.

The in-memory path (train/data/tokenization.py) tokenizes the whole corpus into an Arrow cache first, which is right up
to a few GB. A stream reads the files (local or remote, compressed or not) as a ``datasets.IterableDataset``:
nothing is cached, memory stays flat however large the corpus, and the first step comes after one batch, not after
the whole corpus. What it costs: ``max_steps`` must be given (a stream has no length), examples come in file order
(shuffle the corpus beforehand; a shuffle buffer's content is not saved with a checkpoint, so it would break exact
resume), and evaluation uses a bounded set: ``validation_file``, or the first ``max_eval_samples`` examples of the
stream, held out from training (by their text: a line that also occurs later is left out there too; the hold-out
is train/data/load.py's).

Each rank reads its own part (``datasets.distributed.split_dataset_by_node``: whole files when their count divides
by the world size, else every world-size-th example), so no example is trained twice per pass and no rank waits
for another's preprocessing. The position of every rank's stream is saved with each checkpoint: the Trainer
itself only knows how to resume a stream by reading and throwing away every batch before the checkpoint
(``skip_first_batches``), which re-reads and re-tokenizes the corpus up to there; torchdata's StatefulDataLoader
records where each rank's reader (its DataLoader workers included) stands, and the Trainer saves none of it, so
StreamPosition does. Resumed on another number of ranks, the old ranks' positions are redistributed to the new
ones (train/data/stream_resume.py has the rule).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from datasets import DatasetDict, IterableDataset
from datasets.distributed import split_dataset_by_node
from torchdata.stateful_dataloader import StatefulDataLoader
from transformers import TrainerCallback

from train.borrowed.datasets import fingerprint as fingerprint_of
from train.borrowed.fsspec import s3_ignores_http_client_options
from train.borrowed.torchdata import loader_state_problem, workers_as_loaded
from train.common.distributed import gather_from_every_rank, is_world_zero
from train.common.errors import ConfigError, EnvironmentProblem, first_line
from train.common.hf import cache_key, offline_hint
from train.config import DataArguments
from train.data.padding import Padding
from train.data.raw import TextStream
from train.data.sources import Source, demo_dataset, read_error, shown_url
from train.data.stream_resume import position_problem, rank_position, redistribute
from train.data.tokenization import SAMPLE_INDEX, encode_texts, group_texts
from train.outputs.runfiles import STREAM_STATE, RunFiles

DEMO_SHARDS = 4  # the demo stream's files, so that it splits across ranks by whole shards
SAVED_SHARDS = 16  # a save_to_disk dataset streamed: shards to split across ranks and DataLoader workers


def stream_training_overrides() -> dict[str, Any]:
    """The TrainingArguments a streamed corpus needs, for the caller to apply (data/ never changes the config).

    ``ignore_data_skip``: the Trainer would resume a stream by reading every batch up to the checkpoint;
    StreamPosition restores where each rank stands instead. ``include_num_input_tokens_seen``: real tokens are
    counted as they go by, even where counting was turned off, since a stream has no total to count from."""
    return {"ignore_data_skip": True, "include_num_input_tokens_seen": "non_padding"}


def open_stream(source: Source, data: DataArguments) -> tuple[IterableDataset, str]:
    """``source`` (resolved by train/data/sources.py) as a stream of ``data.text_column`` strings, and a
    fingerprint naming it."""
    if source.kind == "demo":
        rows = demo_dataset(data.text_column, data.demo_samples)
        return rows.to_iterable_dataset(num_shards=DEMO_SHARDS), f"demo-{data.demo_samples}"
    if source.kind == "files":
        if any(f.startswith(("s3://", "s3a://")) for f in source.files):
            s3_ignores_http_client_options()
        stream = datasets.load_dataset(source.builder, data_files=list(source.files), split="train", streaming=True)
        fingerprint = cache_key(source.builder, [shown_url(f) for f in source.files])
    elif source.kind == "saved":
        try:
            loaded = datasets.load_from_disk(source.name)
        except Exception as exc:  # noqa: BLE001 - any failure to read is the user's file
            raise read_error(source.label, source.name, exc) from None
        saved = loaded["train"] if isinstance(loaded, DatasetDict) else loaded
        stream = saved.to_iterable_dataset(num_shards=max(1, min(SAVED_SHARDS, len(saved))))
        fingerprint = fingerprint_of(saved)
    else:
        try:
            stream = datasets.load_dataset(source.name, source.config_name, split="train", streaming=True)
        except Exception as exc:  # noqa: BLE001 - network, offline mode, unknown id
            hint = offline_hint("dataset", "MLM_DATASET")
            raise ConfigError(f"{source.label}={source.name!r}: cannot stream the hub dataset ({hint})") from exc
        fingerprint = cache_key(source.name, source.config_name)
    return _text_only(stream, source, data.text_column), fingerprint


def _text_only(stream: IterableDataset, source: Source, column: str) -> IterableDataset:
    """The stream's ``column``; its first example is read now, so a wrong column or an unreadable file is a clear
    error before the ranks start training. Rows whose text is not a string are dropped later, in TextStream.keep."""
    where = f"{source.label}={shown_url(source.name)!r}"
    try:
        first = next(iter(stream.take(1)), None)
    except Exception as exc:  # noqa: BLE001 - parser, credentials, network: the reader's first line says which
        raise ConfigError(f"{where}: cannot be read ({first_line(exc.__cause__ or exc)})") from None
    if first is None:
        raise ConfigError(f"{where}: no examples")
    if column not in first:
        raise ConfigError(f"{where}: no column {column!r} (columns: {', '.join(first)}); set MLM_TEXT_COLUMN")
    return stream.select_columns([column])


def content_index(input_ids: list[int]) -> int:
    """A stream example's ``sample_index`` (what the collator keys its masks on): a hash of its tokens. Positions
    would repeat across DataLoader workers, each of which counts its own files; content does not depend on who
    reads it or when, so a resumed run masks every example as an uninterrupted one would."""
    digest = hashlib.blake2b(np.asarray(input_ids, dtype=np.int64).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # non-negative int64


def tokenized_stream(
    data: DataArguments, stream: TextStream, tokenizer: Any, rank: int, world_size: int
) -> IterableDataset:
    """Rank ``rank``'s part of the stream, filtered, tokenized (and packed) on the fly in one batched step, each
    example with its sample index."""
    mine = split_dataset_by_node(stream.rows, rank=rank, world_size=world_size)
    packs = Padding(data.padding).packs

    def prepare(texts: list[Any]) -> dict[str, Any]:
        kept = stream.keep(texts)
        # a stream's cuts are not counted; a batch with nothing kept (all held out, or no text) has the columns of
        # one that has (the tokenizer refuses an empty list)
        encoded = encode_texts(tokenizer, kept or [""], data, count_cut=False)
        if not kept:
            encoded = {key: [] for key in encoded}
        if packs:
            encoded = group_texts(encoded, data.max_seq_length)
        return {**encoded, SAMPLE_INDEX: [content_index(ids) for ids in encoded["input_ids"]]}

    return mine.map(prepare, batched=True, input_columns=[stream.column], remove_columns=[stream.column])


def stream_loader(
    dataset: IterableDataset, args: Any, batch_size: int, collate: Any, workers: int | None = None
) -> Any:
    """A StatefulDataLoader over a rank's stream, with the Trainer's batch size, collator and workers (``workers``:
    the number a saved position was written with). Not passed through accelerate's prepare, which would split the
    stream across ranks a second time."""
    # torchdata 0.11 calls torch.set_vital, which torch 2.15 deprecates: a warning per loader, ours to silence.
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
    if workers is None:
        workers = min(args.dataloader_num_workers, max(dataset.num_shards, 1))  # a worker per file at most
    return StreamLoader(
        dataset,
        batch_size=batch_size,
        collate_fn=collate,
        num_workers=workers,
        pin_memory=args.dataloader_pin_memory,
        prefetch_factor=args.dataloader_prefetch_factor if workers else None,
        persistent_workers=args.dataloader_persistent_workers and workers > 0,
        # Its own generator: a DataLoader draws its workers' base seed when an iterator starts, from the global
        # RNG by default, which would shift a resumed run's dropout off the uninterrupted run's (the Trainer
        # restores the RNG state before it starts the iterator).
        generator=torch.Generator().manual_seed(args.seed),
    )


class StreamLoader(StatefulDataLoader):
    """torchdata's StatefulDataLoader, with its position right in the first batches after a resume (torchdata 0.11):
    until a worker has yielded a batch since ``load_state_dict``, ``state_dict`` gives that worker's fresh start,
    not the position loaded, so a checkpoint saved then would read its examples a second time. The loaded snapshot
    is given for such a worker instead (train/borrowed/torchdata.py ``workers_as_loaded``), until every worker has
    yielded or the pass ends.

    Every state it gives is first checked against the layout that mend and the checkpoints read (the check the
    canaries hold torchdata to): a torchdata that writes another is an environment error (exit 3) at the first
    save, since a position saved by guesswork would resume a stream at the wrong place without a word. Not a crash
    (exit 1), which a retry policy would run again to the same end; not a warning, which would leave checkpoints a
    resume refuses as damaged."""

    _loaded: dict[str, Any] | None = None  # the state loaded, while a worker may not have yielded since
    _passes_after_load = 0

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._loaded, self._passes_after_load = state_dict, 0

    def __iter__(self) -> Any:
        self._passes_after_load += 1
        if self._passes_after_load > 1:
            self._loaded = None  # a new pass: the position loaded is behind it
        return super().__iter__()

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if problem := loader_state_problem(state, self.num_workers, self.batch_size or 0):
            raise EnvironmentProblem(
                f"torchdata {package_version('torchdata')} is installed, but its data loader's state is not the one "
                f"train/borrowed/torchdata.py reads (torchdata 0.11: {problem}), so a stream's position cannot be "
                "saved: install the locked versions (requirements.lock), or adapt the touch (docs/development.md, "
                '"Upgrading a library")'
            )
        if self._loaded is None or not self.num_workers:
            return state
        mended = workers_as_loaded(state, self._loaded, self.num_workers)
        if mended is None:
            self._loaded = None  # every worker has yielded since: their own snapshots are right
        return state if mended is None else mended


class StreamPosition(TrainerCallback):
    """Saves every rank's stream position into each checkpoint (``stream_state.json``), before the checkpoint is
    marked complete; ``load`` reads this rank's back for a resumed run. Every rank calls ``on_save`` (the Trainer
    saves on all of them), rank 0 gathers the positions and writes the file.

    JSON, not torch.save: a checkpoint is read back by whoever resumes it, and a pickle in it would run whatever
    code its writer put there. StatefulDataLoader's state over a datasets stream is plain numbers and strings;
    one that is not fails the save with the value named, rather than being written in a form that can run code."""

    def on_save(self, args: Any, state: Any, control: Any, train_dataloader: Any = None, **kwargs: Any) -> None:
        position = train_dataloader.state_dict() if hasattr(train_dataloader, "state_dict") else None
        if position is not None and "kind" not in position:  # this rank's own loader: say whose it is, as built
            loader = getattr(train_dataloader, "base_dataloader", train_dataloader)
            batch, workers = getattr(loader, "batch_size", None), getattr(loader, "num_workers", 0)
            position = rank_position(position, args.process_index, args.world_size, batch, workers)
        positions = gather_from_every_rank(position)
        if is_world_zero():
            checkpoint = RunFiles(args.output_dir).checkpoint(state.global_step)
            if checkpoint.is_dir():
                tmp = checkpoint / (STREAM_STATE + ".tmp")
                tmp.write_text(json.dumps({"world_size": len(positions), "ranks": positions}), encoding="utf-8")
                tmp.replace(checkpoint / STREAM_STATE)

    @staticmethod
    def load(checkpoint: str, rank: int, world_size: int, option: str) -> dict[str, Any] | None:
        """This rank's position in ``checkpoint``, redistributed when another number of ranks saved it
        (train/data/stream_resume.py); None when it holds none (saved before streaming)."""
        path, name = Path(checkpoint) / STREAM_STATE, Path(checkpoint).name
        if not path.exists():
            return None
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            ranks = saved["ranks"] if isinstance(saved, dict) else None
            if not isinstance(ranks, list) or not ranks or saved.get("world_size") != len(ranks):
                raise ValueError("expected every rank's position, as many as its world_size")
            problem = next((p for i, r in enumerate(ranks) if (p := position_problem(r, f"ranks[{i}]"))), None)
            if problem:
                raise ValueError(problem)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"{option}=true: {name}/{STREAM_STATE} is damaged ({first_line(exc)})") from None
        return redistribute(ranks, rank, world_size)
