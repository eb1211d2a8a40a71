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
    assert run["model"] == {"attention": attention, "head": "masked-only", "head_weights": None}
    assert run["world_size"] == int(ranks)
    assert (output / "checkpoint-5" / "trainer_state.json").exists()
    from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

    final = output / "final"
    tokenizer = AutoTokenizer.from_pretrained(final)  # of the family's kind: ModernBERT's byte-level BPE has <mask>
    fill = pipeline("fill-mask", model=AutoModelForMaskedLM.from_pretrained(final), tokenizer=tokenizer)
    assert len(fill(f"this is a {tokenizer.mask_token} sample")) == 5


def test_continued_pretraining_of_an_encoder_without_its_head_says_so_once(tmp_path: Path) -> None:
    """An encoder saved without its MLM head (as sentence-transformers saves one): the banner, run.json and doctor
    say the head is new, once, in our words; transformers' fine-tuning load report stays off the console."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from train.model.weights import HEAD_NEW

    encoder = tmp_path / "encoder"
    words = sorted({w.strip(".,").lower() for w in "This is a training sample for multi-GPU demonstration".split()})
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]))
    BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(encoder)
    sizes = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
    BertModel(BertConfig(vocab_size=5 + len(words), **sizes)).save_pretrained(encoder)
    output = tmp_path / "out"
    env = tiny_env(output, model_name_or_path=str(encoder), config_overrides="", max_steps="4", log_format="text")
    doctor = entrypoint("doctor", env=env)
    assert f"its MLM head is {HEAD_NEW}" in doctor.stdout, doctor.stdout[-3000:]
    done = entrypoint(env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(f"MLM head   {HEAD_NEW}") == 1
    for noise in ("seem corrupted", "LOAD REPORT", "MISSING", "\x1b["):
        assert noise not in done.stdout + done.stderr, noise
    assert json.loads((output / "run.json").read_text())["model"]["head_weights"] == HEAD_NEW
