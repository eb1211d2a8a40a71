"""Architectures beyond BERT through the front door, each the case that failed before: DeBERTa-v2 has no SDPA
(it crashed before training), ModernBERT's overrides left its layer_types stale (it crashed at its first save),
ESM's contact head takes no part in the loss (DDP failed its second step): DeBERTa and ESM under two DDP ranks.
From scratch, 2 layers, 10 steps, a checkpoint on the way; final/ loads and fills a mask. The whole matrix, with
SIGTERM and resume, runs in one process in test_model_matrix.py. ModernBERT's case is of one rank and its save, not
of processes: the job's main() in this process, as the doctor's row is (a launch is about 15 CPU-seconds of
start-up)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import tiny_env
from tests.e2e.runs import entrypoint
from train.common.errors import run_main
from train.doctor.__main__ import main as doctor

pytestmark = pytest.mark.slow

SMALL = "num_hidden_layers=2,hidden_size=64,intermediate_size=128,num_attention_heads=2"


@pytest.mark.parametrize(
    ("model_type", "attention", "ranks"),
    [("deberta-v2", "eager", "2"), ("modernbert", "sdpa", "1"), ("esm", "sdpa", "2")],
)
def test_an_architecture_trains_saves_and_fills_a_mask(
    tmp_path: Path, model_type: str, attention: str, ranks: str, job_in_process: Any
) -> None:
    output = tmp_path / "out"
    env = tiny_env(
        output, model_name_or_path=f"scratch:{model_type}", config_overrides=SMALL, max_steps="10",
        save_strategy="steps", save_steps="5", nproc_per_node=ranks,
    )  # fmt: skip
    if ranks == "1":  # nothing of processes to see: the job's main() here
        assert job_in_process(env) == 0
    else:
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


def test_continued_pretraining_of_a_sentence_transformers_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An embedding model (an encoder without an MLM head, with its pooling module): the banner, run.json and doctor
    say once, in our words, that the head is new, and transformers' fine-tuning load report stays off the console;
    final/ loads both as the masked LM and as the sentence-transformers model, with the trained encoder."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import AutoModelForMaskedLM, BertConfig, BertModel, BertTokenizerFast

    from train.model.weights import HEAD_NEW

    encoder, embedder = tmp_path / "encoder", tmp_path / "embedder"
    words = sorted({w.strip(".,").lower() for w in "This is a training sample for multi-GPU demonstration".split()})
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]))
    tokenizer = BertTokenizerFast(vocab_file=str(vocab))
    sizes = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
    BertModel(BertConfig(vocab_size=5 + len(words), **sizes)).save_pretrained(encoder)
    tokenizer.save_pretrained(encoder)
    module = Transformer(str(encoder))
    SentenceTransformer(modules=[module, Pooling(module.get_word_embedding_dimension())]).save(str(embedder))
    tokenizer.save_pretrained(embedder)

    output = tmp_path / "out"
    env = tiny_env(output, model_name_or_path=str(embedder), config_overrides="", max_steps="4", log_format="text")
    capsys.readouterr()
    run_main(lambda argv: doctor(argv, env), [])  # its exit code is the machine's (no GPU here), not the model's
    said = capsys.readouterr().out
    assert f"its MLM head is {HEAD_NEW}" in said, said[-3000:]
    # The run is launched: the console it prints is the contract (the load report kept off it in every process).
    done = entrypoint(env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(f"MLM head   {HEAD_NEW}") == 1
    for noise in ("seem corrupted", "LOAD REPORT", "MISSING", "\x1b["):
        assert noise not in done.stdout + done.stderr, noise
    assert json.loads((output / "run.json").read_text())["model"]["head_weights"] == HEAD_NEW
    assert "final/ keeps the sentence-transformers modules around the trained encoder (1_Pooling)" in done.stderr

    final = output / "final"
    masked_lm = AutoModelForMaskedLM.from_pretrained(final)
    embeddings = SentenceTransformer(str(final), device="cpu")
    assert embeddings.encode(["this is a sample"]).shape == (1, 32)
    trained = masked_lm.bert.embeddings.word_embeddings.weight
    assert embeddings[0].auto_model.embeddings.word_embeddings.weight.equal(trained)  # the encoder trained here
    assert not BertModel.from_pretrained(encoder).embeddings.word_embeddings.weight.equal(trained)
