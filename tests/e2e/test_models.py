"""Architectures beyond BERT through the front door, each the case that failed before: DeBERTa-v2 has no SDPA
(it crashed before training), ModernBERT's overrides left its layer_types stale (it crashed at its first save),
ESM's contact head takes no part in the loss (DDP failed its second step): DeBERTa and ESM under two DDP ranks.
From scratch, 2 layers, 10 steps, a checkpoint on the way; final/ loads and fills a mask. The whole matrix, with
SIGTERM and resume, runs in one process in test_model_matrix.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import tiny_env
from tests.e2e.runs import entrypoint

pytestmark = pytest.mark.slow

SMALL = "num_hidden_layers=2,hidden_size=64,intermediate_size=128,num_attention_heads=2"


@pytest.mark.parametrize(
    ("model_type", "attention", "ranks"),
    [("deberta-v2", "eager", "2"), ("modernbert", "sdpa", "1"), ("esm", "sdpa", "2")],
)
def test_an_architecture_trains_saves_and_fills_a_mask(
    tmp_path: Path, model_type: str, attention: str, ranks: str
) -> None:
    output = tmp_path / "out"
    env = tiny_env(
        output, model_name_or_path=f"scratch:{model_type}", config_overrides=SMALL, max_steps="10",
        save_strategy="steps", save_steps="5", nproc_per_node=ranks,
    )  # fmt: skip
    done = entrypoint(env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads((output / "run.json").read_text())
    assert run["model"] == {"attention": attention, "head": "masked-only"}
    assert run["world_size"] == int(ranks)
    assert (output / "checkpoint-5" / "trainer_state.json").exists()
    from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

    final = output / "final"
    tokenizer = AutoTokenizer.from_pretrained(final)  # of the family's kind: ModernBERT's byte-level BPE has <mask>
    fill = pipeline("fill-mask", model=AutoModelForMaskedLM.from_pretrained(final), tokenizer=tokenizer)
    assert len(fill(f"this is a {tokenizer.mask_token} sample")) == 5
