"""Where a training step's time goes, in every training record: how close to the device's peak the arithmetic runs
(``mfu``), the share of the time spent waiting for the next batch (``data_wait_share``), how full the batches are
(``packing_efficiency``), and this rank's real tokens per second (``tokens_per_second_per_rank``).

Measured on each rank over each logging window, the steps' wall time with evaluations and saves left out (as the
records' speeds are), from the batches the rank fetched (MLMTrainer.get_batch_samples times their coming and
hands them over). The records carry rank 0's figures.

Model FLOPs count the useful arithmetic of a step only, real tokens only (docs/monitoring.md, "MFU"): a training
step is three forward passes' worth (forward, and a backward of twice its cost), two FLOPs a multiply-add, so

    6 x body parameters x real tokens                 every real token through the encoder's layers
  + 12 x layers x hidden size x sum of spans squared  attention's scores and weighted sums, each span (a padded
                                                       row's real tokens, a packed document kept apart, a packed
                                                       row otherwise) attending to itself
  + 6 x head parameters x predicted tokens            the head at the masked positions (masked-only head) or at
                                                       every real token (dense head)

Padding, the positions a packed row does not fill and a recomputation count nothing. The body leaves the embedding
tables out (a lookup, not a product); the head's vocabulary projection is counted whether or not it is tied to them.
The counts stay on the batch's device until the window's record (one synchronisation per logged step).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from transformers import TrainerCallback

from train.common import distributed
from train.common.console import warn
from train.common.handoff import Handoff, precision_label, precision_name
from train.common.hf import cache_root
from train.machine.peaks import Peak, device_peak
from train.model.head import IGNORE_INDEX

# A run whose steps wait for their batches this share of the time, over this many logging windows in a row (the
# session's first left out: the loader starts in it), is said to be starved, once.
STARVED_SHARE = 0.3
STARVED_WINDOWS = 3
FIELDS = ("positions", "real", "masked", "attended")  # a batch's counts, in this order


@dataclass(frozen=True)
class TokenFlops:
    """The model's sizes the step's FLOPs are counted from (the module docstring's formula)."""

    body: int  # the encoder's parameters a token is multiplied through, embedding tables left out
    head: int  # the head's, per predicted token: its transform and the vocabulary projection
    layers: int
    hidden: int
    masked_only: bool  # the head predicts the masked positions only (train/model/head.py)

    @classmethod
    def of(cls, model: Any, masked_only: bool) -> TokenFlops | None:
        """``model``'s sizes (before DDP or FSDP wrap it); None for a model without a ``base_model`` encoder or the
        config's layer count and hidden size."""
        encoder, config = getattr(model, "base_model", None), getattr(model, "config", None)
        layers, hidden = getattr(config, "num_hidden_layers", None), getattr(config, "hidden_size", None)
        if encoder is None or encoder is model or not isinstance(layers, int) or not isinstance(hidden, int):
            return None
        embeddings = [module for module in encoder.modules() if isinstance(module, torch.nn.Embedding)]
        tables = {id(p) for module in embeddings for p in module.parameters()}
        encoder_ids = {id(p) for p in encoder.parameters()}
        body = sum(p.numel() for p in encoder.parameters() if id(p) not in tables)
        head = sum(p.numel() for p in model.parameters() if id(p) not in encoder_ids)
        output = model.get_output_embeddings()
        weight = getattr(output, "weight", None)
        if isinstance(weight, torch.Tensor) and id(weight) in encoder_ids:  # tied: counted once, as the head's too
            head += weight.numel()
        return cls(body=body, head=head, layers=layers, hidden=hidden, masked_only=masked_only)

    def of_counts(self, counts: dict[str, int]) -> float:
        """The FLOPs of a training step over batches with these ``counts`` (:func:`batch_counts`)."""
        predicted = counts["masked"] if self.masked_only else counts["real"]
        return float(
            6 * self.body * counts["real"]
            + 12 * self.layers * self.hidden * counts["attended"]
            + 6 * self.head * predicted
        )


def rank_peak(training: Any, handoff: Handoff | None) -> Peak | None:
    """The peak of this rank's device at the run's precision, by the one rule (train/machine/peaks.py
    ``device_peak``): a GPU's by its name (the launcher's, else CUDA's); the CPU's on this rank's threads, measured
    on a node's first rank while the others wait (TrainingArguments' ``main_process_first``), which then read the
    figure it cached (probes side by side share the cores and read low). None for another device, or a GPU the
    table lacks."""
    precision = precision_label(precision_name(training.fp16, training.bf16), bool(training.tf32))
    if training.device.type == "cuda":
        index = training.local_process_index
        names = handoff.gpus if handoff is not None else []
        name = names[index] if index < len(names) else torch.cuda.get_device_name(training.device)
        return device_peak(name, precision, torch.get_num_threads(), cache_root())
    if training.device.type != "cpu":
        return None
    with training.main_process_first(local=True, desc="measuring the CPU's peak"):
        return device_peak(None, precision, torch.get_num_threads(), cache_root())


def spans_squared(position_ids: torch.Tensor) -> torch.Tensor:
    """The sum over a packed batch's documents of their lengths squared: a document starts where the positions do
    not go up (every position rule restarts them per document: train/model/packing.py). Computed without leaving
    the device: a document of n tokens is the sum of 2k - 1 over its k = 1..n."""
    rows, length = position_ids.shape
    index = torch.arange(length, device=position_ids.device).expand(rows, length)
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] <= position_ids[:, :-1]
    last_start = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return (2 * (index - last_start) + 1).sum()


def batch_counts(batch: dict[str, Any]) -> torch.Tensor:
    """A batch's positions, real tokens, masked tokens and attention spans squared (FIELDS), on its device. Real
    tokens as the Trainer counts them (MLMTrainer.track_num_input_tokens): a 2D attention mask's ones, else every
    position (packed and padding-free layouts have none to pad)."""
    ids = batch["input_ids"]
    mask, labels = batch.get("attention_mask"), batch.get("labels")
    positions = torch.tensor(ids.numel(), device=ids.device)
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        lengths = mask.sum(dim=1)
        real, attended = lengths.sum(), (lengths * lengths).sum()
    else:
        real = positions
        spans = batch.get("cu_seq_lens_q")
        if isinstance(spans, torch.Tensor):  # padding-free: one row of documents, their boundaries given
            lengths = spans.diff()
            attended = (lengths * lengths).sum()
        elif isinstance(batch.get("position_ids"), torch.Tensor):  # packed, documents apart
            attended = spans_squared(batch["position_ids"])
        else:  # packed across documents: a row attends to itself whole
            attended = torch.tensor(ids.shape[0] * ids.shape[-1] ** 2, device=ids.device)
    masked = (labels != IGNORE_INDEX).sum() if isinstance(labels, torch.Tensor) else torch.zeros_like(positions)
    return torch.stack([positions, real, masked, attended]).to(torch.int64)


class StepClock(TrainerCallback):
    """Training time, step end to step end: the first step's from the start of training, evaluations' and saves'
    time left out (the clock restarts after them). :meth:`step_took` is told each step's time."""

    def __init__(self) -> None:
        self._mark: float | None = None

    def step_took(self, seconds: float) -> None:
        """A step took ``seconds`` of training time."""

    def _restart(self) -> None:
        self._mark = time.monotonic()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._restart()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        ended = time.monotonic()
        if self._mark is not None:
            self.step_took(ended - self._mark)
        self._mark = ended

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._restart()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._restart()


class StepDiagnostics(StepClock):
    """This rank's window: the training time (StepClock's), the time spent fetching batches, and the fetched
    batches' counts; :meth:`window` gives the figures and starts a new one."""

    def __init__(self, flops: TokenFlops | None, peak: Peak | None) -> None:
        super().__init__()
        self.flops = flops
        self.peak = peak
        self._busy = 0.0
        self._waited = 0.0
        self._steps = 0
        self._counts: torch.Tensor | None = None
        self._windows = 0
        self._starved: list[float] = []
        self.said_starved = False

    def timed(self, batches: Iterable[Any]) -> Iterator[Any]:
        """``batches``, the time each took to come (the loader's, and the collator's in this process) added to the
        window's wait."""
        iterator = iter(batches)
        while True:
            start = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            finally:
                self._waited += time.perf_counter() - start
            yield batch

    def fetched(self, batches: list[Any]) -> None:
        """A step's batches, counted (:func:`batch_counts`)."""
        for batch in batches:
            if isinstance(batch, dict) and isinstance(batch.get("input_ids"), torch.Tensor):
                counts = batch_counts(batch)
                self._counts = counts if self._counts is None else self._counts + counts.to(self._counts.device)

    def step_took(self, seconds: float) -> None:
        self._busy += seconds
        self._steps += 1

    def waited(self) -> tuple[float, int]:
        """The window's time spent fetching batches, and its steps (before :meth:`window` starts a new one)."""
        return self._waited, self._steps

    def window(self) -> dict[str, float]:
        """The figures of the steps since the last window (nothing when no step was timed), then a new window."""
        busy, waited, counts = self._busy, self._waited, self._counts
        self._busy, self._waited, self._counts, self._steps = 0.0, 0.0, None, 0
        if busy <= 0 or counts is None:
            return {}
        counted = dict(zip(FIELDS, counts.tolist(), strict=True))
        figures: dict[str, float] = {"data_wait_share": round(min(waited / busy, 1.0), 4)}
        if counted["positions"]:
            figures["packing_efficiency"] = round(counted["real"] / counted["positions"], 4)
        figures["tokens_per_second_per_rank"] = round(counted["real"] / busy, 1)
        if self.flops is not None and self.peak is not None:
            figures["mfu"] = round(self.flops.of_counts(counted) / busy / self.peak.flops, 4)
        self._watch_starvation(figures["data_wait_share"])
        return figures

    def _watch_starvation(self, share: float) -> None:
        """Say once, on rank 0, when the steps have waited for their batches STARVED_SHARE of the time or more over
        STARVED_WINDOWS windows in a row, and what to change."""
        self._windows += 1
        if self._windows == 1:  # the session's first window holds the loader's start
            return
        self._starved = [*self._starved, share][-STARVED_WINDOWS:] if share >= STARVED_SHARE else []
        if len(self._starved) < STARVED_WINDOWS or self.said_starved:
            return
        self.said_starved = True
        if distributed.is_world_zero():
            warn(
                f"data: the steps waited for their next batch {min(self._starved):.0%} of the time or more over the "
                f"last {STARVED_WINDOWS} records: the device is starved; give the loader more workers "
                f"(MLM_DATALOADER_NUM_WORKERS), tokenize the corpus before the run (./entrypoint.sh prepare), or "
                f"read a remote corpus streaming (MLM_STREAMING)"
            )
