"""A slow rank named (the rule: train/common/stragglers.py): each rank measures its own time per step - fetching
its batches and its forward passes - and at each training record the ranks' times are gathered; every record
carries them (``rank_step_s/N``), and a rank slow for SLOW_RECORDS records in a row is named once, in a warning
and in run.json's ``stragglers``.

Why these parts of a step: under DDP no collective runs in them (the buffers' broadcast comes before the model's own
forward, the gradients' reduction in the backward), so a rank's figure is its own work, not its wait for the
slowest; the backward and the optimizer's step, where the fast ranks wait, are left out. NVRx's straggler
detection times the same sections (data loading, forward). On a GPU the forward is timed on the device (CUDA
events, read at the record), not by the clock of the host, which runs ahead of the kernels. Under FSDP a forward
gathers each layer's parameters from every rank: the fast ranks wait inside it for the slow one, and a straggler
there reads as every rank being slow; its batches' fetch still shows. torch's own ``torch.distributed`` has no
such measure."""

from __future__ import annotations

import time
from typing import Any

import torch

from train.common import distributed
from train.common.console import warn
from train.common.stragglers import RANK_STEP, SLOW_RECORDS, Straggler, slow_ranks, straggler_line


class ForwardClock:
    """The time of the model's forward passes in training (not evaluation's), summed until :meth:`take`."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.cuda = next((p.device.type == "cuda" for p in model.parameters()), False)
        self._seconds = 0.0
        self._started = 0.0
        self._events: list[tuple[Any, Any]] = []
        model.register_forward_pre_hook(self._begin)
        model.register_forward_hook(self._end)

    def _begin(self, module: torch.nn.Module, inputs: Any) -> None:
        if not module.training:
            return
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            self._events.append((start, None))
        else:
            self._started = time.perf_counter()

    def _end(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if not module.training:
            return
        if self.cuda and self._events and self._events[-1][1] is None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events[-1] = (self._events[-1][0], end)
        elif not self.cuda and self._started:
            self._seconds += time.perf_counter() - self._started
            self._started = 0.0

    def take(self) -> float:
        """The seconds since the last take (on a GPU, once its forward passes have run)."""
        seconds, self._seconds = self._seconds, 0.0
        timed = [(start, end) for start, end in self._events if end is not None]
        if timed:
            timed[-1][1].synchronize()
            seconds += sum(start.elapsed_time(end) for start, end in timed) / 1000.0
        self._events = []
        return seconds


class Stragglers:
    """This rank's own time, gathered from every rank at each training record (:meth:`window`); the ranks named
    so far (:meth:`record`, run.json's ``stragglers``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.forward = ForwardClock(model)
        self.named: list[Straggler] = []
        self._streaks: dict[int, int] = {}
        self._records = 0

    def window(self, step: int, steps: int, waited_s: float) -> dict[str, float]:
        """Every rank (a collective): this rank's own time per step over the ``steps`` since the last record
        (``waited_s`` of it for its batches), gathered; the record's ``rank_step_s/N`` figures. Nothing with one
        rank, or no step timed (every rank alike: the steps are the Trainer's)."""
        own = self.forward.take() + waited_s
        if not distributed.several_ranks() or steps < 1:
            return {}
        seconds = distributed.gather_from_every_rank(own / steps)
        self._records += 1
        if self._records > 1:  # the session's first record holds the loader's start and the first allocations
            self.watch(step, seconds)
        return {f"{RANK_STEP}{rank}": round(s, 4) for rank, s in enumerate(seconds)}

    def watch(self, step: int, seconds: list[float]) -> None:
        """A record's times, every rank's (by world rank): a rank slow SLOW_RECORDS records in a row is named, once."""
        slow = slow_ranks(seconds)
        self._streaks = {rank: self._streaks.get(rank, 0) + 1 for rank in slow}
        for rank, streak in self._streaks.items():
            if streak < SLOW_RECORDS or any(s.rank == rank for s in self.named):
                continue
            ratio, median = slow[rank]
            straggler = Straggler(rank, step, ratio, round(seconds[rank], 4), median)
            self.named.append(straggler)
            if distributed.is_world_zero():
                warn(straggler_line(straggler))

    def record(self) -> list[dict[str, object]] | None:
        """run.json's ``stragglers``: the ranks named, [] where none was; None with one rank (nothing compared)."""
        if not distributed.several_ranks():
            return None
        return [s.record() for s in self.named]
