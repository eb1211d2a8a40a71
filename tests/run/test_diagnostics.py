"""Where a step's time goes (train/run/diagnostics.py) and the peaks MFU is a share of (train/machine/peaks.py)."""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertForMaskedLM

from tests.helpers import threads_in_the_probe, torch_threads
from train.common.handoff import Handoff
from train.machine import peaks
from train.machine.peaks import Peak, cpu_peak, device_peak, gpu_peak, matmul_precision, measure_cpu_flops
from train.model.head import IGNORE_INDEX, use_masked_only_head
from train.run import diagnostics
from train.run.diagnostics import (
    FIELDS,
    STARVED_WINDOWS,
    StepDiagnostics,
    TokenFlops,
    batch_counts,
    rank_peak,
    spans_squared,
)


def tiny_bert() -> BertForMaskedLM:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=64,
    )  # fmt: skip
    return BertForMaskedLM(config)


def full_rows(rows: int = 4, length: int = 32) -> dict[str, torch.Tensor]:
    """Rows without padding, a fifth of their positions masked."""
    ids = torch.randint(5, 1000, (rows, length))
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, ::5] = ids[:, ::5]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def counted(batch: dict[str, torch.Tensor]) -> dict[str, int]:
    return dict(zip(FIELDS, batch_counts(batch).tolist(), strict=True))


@pytest.mark.parametrize("masked_only", [False, True])
def test_the_flops_formula_is_what_torch_counts_in_a_step(masked_only: bool) -> None:
    """The docstring's formula against torch's own count of a forward and backward's matrix products, on full rows
    (torch counts the arithmetic done; ours the useful part, the same without padding): within 5 %. The masked-only
    head's step costs what the formula says, not the dense head's."""
    model = tiny_bert()
    if masked_only:
        use_masked_only_head(model)
    flops = TokenFlops.of(model, masked_only)
    assert flops is not None
    batch = full_rows()
    with FlopCounterMode(display=False) as counter:
        model(**batch).loss.backward()
    assert flops.of_counts(counted(batch)) == pytest.approx(counter.get_total_flops(), rel=0.05)


def test_padding_and_documents_apart_count_only_real_tokens_and_their_spans() -> None:
    ids = torch.randint(5, 1000, (2, 8))
    padded = {"input_ids": ids, "attention_mask": torch.tensor([[1] * 8, [1] * 3 + [0] * 5])}
    assert counted(padded) == {"positions": 16, "real": 11, "masked": 0, "attended": 64 + 9}
    # Packed rows, documents apart: a document starts where the positions stop going up (RoBERTa's start at 2).
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2], [2, 3, 4, 5, 2, 3, 2, 3]])
    assert spans_squared(positions).item() == (9 + 4 + 9) + (16 + 4 + 4)
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[0, 0] = 7
    apart = {"input_ids": ids, "position_ids": positions, "labels": labels}
    assert counted(apart) == {"positions": 16, "real": 16, "masked": 1, "attended": 22 + 24}
    across = {"input_ids": ids}  # packed across documents: each row attends to itself whole
    assert counted(across)["attended"] == 2 * 64
    free = {"input_ids": ids[:1], "cu_seq_lens_q": torch.tensor([0, 3, 8], dtype=torch.int32)}
    assert counted(free)["attended"] == 9 + 25


def test_a_window_gives_mfu_data_wait_and_packing_efficiency(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([10.0, 11.0, 12.0])  # train begins, then two step ends: 2 s of training
    monkeypatch.setattr(diagnostics.time, "monotonic", lambda: next(clock))
    ticks = iter([0.0, 0.5, 1.0, 1.25])  # each batch's coming: 0.5 s and 0.25 s
    monkeypatch.setattr(diagnostics.time, "perf_counter", lambda: next(ticks))
    flops = TokenFlops(body=1000, head=100, layers=2, hidden=8, masked_only=True)
    watch = StepDiagnostics(flops, Peak(1e6, "test"))
    watch.on_train_begin(None, None, None)
    batch = {
        "input_ids": torch.ones(2, 4, dtype=torch.long),
        "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]),
        "labels": torch.tensor([[5, -100, -100, -100], [-100, 5, -100, -100]]),
    }
    for _ in range(2):
        watch.fetched(list(itertools.islice(watch.timed([batch]), 1)))  # as the Trainer takes its step's batches
        watch.on_step_end(None, None, None)
    figures = watch.window()
    real, attended, masked = 12, 2 * (16 + 4), 4
    assert figures["data_wait_share"] == pytest.approx(0.75 / 2)
    assert figures["packing_efficiency"] == pytest.approx(12 / 16)
    assert figures["tokens_per_second_per_rank"] == pytest.approx(real / 2)
    model_flops = 6 * 1000 * real + 12 * 2 * 8 * attended + 6 * 100 * masked
    assert figures["mfu"] == pytest.approx(model_flops / 2 / 1e6, abs=1e-4)
    assert watch.window() == {}  # a new window: nothing timed yet


def test_a_starved_run_says_so_once_after_the_windows_in_a_row(capsys: pytest.CaptureFixture[str]) -> None:
    watch = StepDiagnostics(None, None)
    shares = [0.9, 0.5, 0.1, 0.4, 0.35]  # the first window (the loader's start) and a dip do not count
    for share in shares + [0.5] * (STARVED_WINDOWS - 2) + [0.9, 0.9]:
        watch._watch_starvation(share)
    said = [line for line in capsys.readouterr().err.splitlines() if "starved" in line]
    assert len(said) == 1 and "MLM_DATALOADER_NUM_WORKERS" in said[0] and "prepare" in said[0]
    quiet = StepDiagnostics(None, None)
    for share in [0.9, 0.5, 0.5, 0.1, 0.5, 0.5]:
        quiet._watch_starvation(share)
    assert not quiet.said_starved


def test_gpu_peaks_by_name_and_precision() -> None:
    assert gpu_peak("NVIDIA H100 80GB HBM3", "bf16") == Peak(989.4e12, "H100's datasheet, dense bf16: 989.4 TFLOP/s")
    assert gpu_peak("NVIDIA H100 PCIe", "bf16 + tf32").flops == pytest.approx(756e12)  # type: ignore[union-attr]
    assert gpu_peak("NVIDIA A100-SXM4-80GB", "fp32 + tf32").flops == pytest.approx(156e12)  # type: ignore[union-attr]
    assert gpu_peak("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 there: no figure rather than a wrong one
    assert gpu_peak("Some Future GPU", "bf16") is None
    assert matmul_precision("fp32") == "fp32" and matmul_precision("fp16 + tf32") == "fp16"


def test_the_cpu_peak_is_measured_once_and_a_bad_cache_measured_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measured: list[float] = []

    def measure(threads: int) -> float:
        measured.append(5e10)
        return 5e10

    monkeypatch.setattr(peaks, "measure_cpu_flops", measure)
    first = cpu_peak(tmp_path, 2, "2.15.0")
    again = cpu_peak(tmp_path, 2, "2.15.0")
    assert first.flops == again.flops == 5e10 and len(measured) == 1
    assert "cached" in again.source and "now" in first.source
    cpu_peak(tmp_path, 4, "2.15.0")  # another thread count is another figure
    assert len(measured) == 2
    cache = tmp_path / peaks.CACHE_FILE
    cache.write_text(json.dumps({key: "fast" for key in json.loads(cache.read_text())}))
    assert cpu_peak(tmp_path, 2, "2.15.0").flops == 5e10 and len(measured) == 3
    cache.write_text("[1, 2")
    assert cpu_peak(tmp_path, 2, "2.15.0").flops == 5e10 and len(measured) == 4


def test_the_cpu_probe_runs_on_the_threads_asked_and_puts_torchs_own_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Doctor probes for the plan's thread count, not its own process's: the figure is measured on the count it is
    labelled with, and the process keeps its own count after, the probe failing or not."""
    seen = threads_in_the_probe(monkeypatch)
    with torch_threads(3):
        assert measure_cpu_flops(1, size=16, repeats=2) > 0
        assert seen == [1, 1, 1] and torch.get_num_threads() == 3
        monkeypatch.setattr(torch, "randn", lambda *size: (_ for _ in ()).throw(RuntimeError("no memory")))
        with pytest.raises(RuntimeError):
            measure_cpu_flops(2)
        assert torch.get_num_threads() == 3


def test_the_one_peak_rule_a_gpus_from_the_table_a_cpus_measured_on_its_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []
    monkeypatch.setattr(peaks, "measure_cpu_flops", lambda threads: asked.append(threads) or 4e10)
    assert device_peak("NVIDIA H100 80GB HBM3", "bf16", 8, tmp_path) == gpu_peak("NVIDIA H100 80GB HBM3", "bf16")
    assert device_peak("Some Future GPU", "bf16", 8, tmp_path) is None and asked == []  # no CPU probe for a GPU
    cpu = device_peak(None, "fp32", 3, tmp_path)
    assert cpu is not None and cpu.flops == 4e10 and asked == [3] and "(3 threads" in cpu.source


class Ranks:
    """A rank's TrainingArguments as rank_peak reads them, with ``main_process_first`` saying when it is in it."""

    def __init__(self, device: str, bf16: bool = False) -> None:
        self.device = torch.device(device)
        self.fp16, self.bf16, self.tf32 = False, bf16, None
        self.local_process_index = 0
        self.first: list[bool] = []  # inside main_process_first, at each probe
        self.inside = False
        self.entered: list[tuple[bool, str]] = []

    @contextlib.contextmanager
    def main_process_first(self, local: bool = True, desc: str = "work") -> Iterator[None]:
        self.entered.append((local, desc))
        self.inside = True
        try:
            yield
        finally:
            self.inside = False


def test_a_ranks_cpu_peak_is_probed_on_a_nodes_first_rank_while_the_others_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe runs inside main_process_first (node-local: the others wait, then read the cached figure), on this
    rank's threads; a GPU's peak needs no probe and no wait."""
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    training = Ranks("cpu")

    def measure(threads: int) -> float:
        training.first.append(training.inside)
        return 3e10

    monkeypatch.setattr(peaks, "measure_cpu_flops", measure)
    with torch_threads(2):
        peak = rank_peak(training, None)
    assert peak is not None and peak.flops == 3e10 and "(2 threads" in peak.source
    assert training.first == [True] and [local for local, _ in training.entered] == [True]
    other = Ranks("cpu")  # a rank that waited: it reads the figure the first one cached
    with torch_threads(2):
        cached = rank_peak(other, None)
    assert cached is not None and cached.flops == 3e10 and "cached" in cached.source and len(training.first) == 1
    gpu = Ranks("cuda", bf16=True)
    handoff = Handoff("bf16", 8, "batch", "1", gpus=["NVIDIA H100 80GB HBM3"])
    assert rank_peak(gpu, handoff) == gpu_peak("NVIDIA H100 80GB HBM3", "bf16") and gpu.entered == []
    assert rank_peak(SimpleNamespace(device=torch.device("meta"), fp16=False, bf16=False, tf32=None), None) is None
