"""The benchmark's per-rank program wraps the job's own prepare: when the job's structure moves, this fails here
rather than every benchmark run failing at its first step."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from train.outputs.facts import RunFacts
from train.outputs.runfiles import RunFiles


def test_the_probe_wraps_the_jobs_prepare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import BertConfig, BertForMaskedLM

    import bench.harness as harness
    import train.run.job as job

    added = []
    model = BertForMaskedLM(
        BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    )
    trainer = SimpleNamespace(model=model, add_callback=added.append)
    facts = RunFacts(dataset_fingerprint="fp", train_samples=1, train_real_tokens=10)
    prepared = SimpleNamespace(trainer=trainer, head="masked-only", facts=lambda: facts)
    monkeypatch.setattr(job, "prepare", lambda config, files, choose_resume: prepared)  # as train/run/job.py calls it
    harness.install_probe(tmp_path / "probe.json")
    config = SimpleNamespace(
        data=SimpleNamespace(padding="packed", max_seq_length=128), masking=SimpleNamespace(mlm_probability=0.15)
    )
    assert job.prepare(config, RunFiles(tmp_path), lambda: None) is prepared
    assert [type(c).__name__ for c in added] == ["StepProbe"]
