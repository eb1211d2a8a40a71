"""Utilisation and memory of the GPUs a rank was given, sampled for the per-step logs (train/run/logs.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class Sampler:
    """Utilisation and memory of the GPUs a rank was given, by UUID (the launcher's ``CUDA_VISIBLE_DEVICES``).

    Silently nothing without NVML or GPUs: the figures are optional, a training step never waits on them. Each
    record's ``index`` is the device's CUDA ordinal, what the rank sees as ``cuda:index``.
    """

    def __init__(self, uuids: Sequence[str]) -> None:
        self.uuids = list(uuids)
        self._nvml: Any = None
        self._handles: list[tuple[int, Any]] = []

    def start(self) -> None:
        if not self.uuids:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # no driver library, a broken driver: metrics are optional
            return
        handles = []
        for position, uuid in enumerate(self.uuids):
            try:
                handles.append((position, pynvml.nvmlDeviceGetHandleByUUID(uuid)))
            except pynvml.NVMLError:
                continue
        self._nvml, self._handles = pynvml, handles

    def sample(self) -> list[dict[str, Any]]:
        if self._nvml is None:
            return []
        found = []
        for index, handle in self._handles:
            try:
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
                util = self._nvml.nvmlDeviceGetUtilizationRates(handle)
            except self._nvml.NVMLError:  # one GPU fell off the bus, or a MIG instance without utilisation
                continue
            found.append(
                {
                    "index": index,
                    "util_pct": int(util.gpu),
                    "mem_used_mib": round(memory.used / 2**20),
                    "mem_total_mib": round(memory.total / 2**20),
                }
            )
        return found

    def stop(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
        self._nvml = None
