"""MLM_SHARDING through the front door (./entrypoint.sh, two gloo ranks): fsdp against ddp (auto, on CPU) from the
same seed gives the same losses step by step, each rank measures about half of ddp's parameters + gradients + AdamW
state, and final/ is a consolidated model that loads and fills a mask; a run stopped by SIGTERM resumes from its
sharded checkpoint and ends with the uninterrupted run's weights bit for bit, and a checkpoint resumed on one rank
from two and on two from one goes on as the uninterrupted run did, within 2 % (the optimizer's shards resharded by
torch.distributed.checkpoint); the model matrix trains sharded, BERT's run streamed
and evaluated. A pretrained model is loaded by rank 0 alone: the other ranks build it on the meta device and hold
only their shards."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from tests.conftest import tiny_env
from tests.data.helpers import write_shards
from tests.e2e.runs import OVERRIDES, SMALL, continues, entrypoint, logged_losses, records, start, wait_for
from tests.e2e.test_model_matrix import fills_a_mask

pytestmark = pytest.mark.slow

STEPS = 20


# Every 5 steps, all four kept: a run resumed from checkpoint-10 keeps saving on the checkpoint's schedule (the
# Trainer's state carries save_steps), and on_one_rank's checkpoint-15 is the one it hands on.
SAVING = {"save_strategy": "steps", "save_steps": "5", "save_total_limit": "4"}


def sharded_env(output_dir: Path, sharding: str, ranks: int = 2, **options: str) -> dict[str, str]:
    """A 20-step run's environment (global batch 16: 8 per device) through ./entrypoint.sh on ``ranks`` ranks."""
    defaults = {
        "per_device_train_batch_size": "8", "max_steps": str(STEPS), "eval_strategy": "no", "logging_steps": "1",
        "log_format": "json", "save_strategy": "no",
    }  # fmt: skip
    # every rank's lines: a rank that fails shows why in the assertion's output (a C++ abort leaves no traceback)
    env = tiny_env(output_dir, sharding=sharding, nproc_per_node=str(ranks), log_ranks="all", **{**defaults, **options})
    return env


def trained(output_dir: Path, sharding: str, ranks: int = 2, **options: str) -> dict[str, Any]:
    """A whole run; its run.json, with the logged losses by step under "losses"."""
    done = entrypoint(env=sharded_env(output_dir, sharding, ranks, **options))
    assert done.returncode == 0, done.stderr[-3000:]
    return finished(output_dir)


def finished(output_dir: Path) -> dict[str, Any]:
    """A finished run's run.json, with the logged losses by step under "losses" and the ranks of the checkpoint it
    resumed from under "resumed_from_ranks"."""
    run = json.loads((output_dir / "run.json").read_text())
    run["losses"] = logged_losses(output_dir)
    banners = [r for r in records(output_dir / "logs" / "train.jsonl") if r.get("event") == "banner"]
    run["resumed_from_ranks"] = banners[-1].get("resumed_from_ranks")
    return run


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted fsdp run on two ranks, saving every 5 steps: its output directory."""
    output = tmp_path_factory.mktemp("whole") / "out"
    trained(output, "fsdp", **SAVING)
    return output


@pytest.fixture(scope="module")
def on_one_rank(tmp_path_factory: pytest.TempPathFactory, whole: Path) -> Path:
    """``whole``'s checkpoint-10 resumed on one rank, saving at steps 15 and 20: its output directory. Its
    checkpoint-15 is one rank's, to resume on two (one launch for both directions of the resharding)."""
    output = tmp_path_factory.mktemp("one") / "out"
    trained(output, "fsdp", ranks=1, resume=str(whole / "checkpoint-10"), **SAVING)
    return output


def per_rank(run: dict[str, Any]) -> list[int]:
    return [sum(rank.values()) for rank in run["sharding"]["state_bytes_per_rank"]]


# 12 layers of 512: 38M parameters (155 MB). A rank's growth in resident memory while it sets up its model carries
# 15-28 MB besides the model (measured on 2 cores: the temporaries of the broadcast, the allocator's and the imports'
# share); with 6 layers (77 MB) a shard of half the model plus that came within 0.85x of the whole model in CI.
BERT_38M = {"hidden_size": 512, "num_hidden_layers": 12, "num_attention_heads": 8, "intermediate_size": 2048}


def pretrained_bert(directory: Path, sizes: dict[str, int] = BERT_38M) -> int:
    """A pretrained BERT of about 38M parameters (155 MB), saved with a word-level tokenizer of the demo's words:
    large enough that holding it or not shows in a rank's resident memory, beside what else a rank's set-up takes.
    Its weights' bytes."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    from train.data.sources import DEMO_SENTENCE

    directory.mkdir(parents=True)
    words = sorted({word.strip(".,").lower() for word in DEMO_SENTENCE.split()})
    (directory / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]))
    tokenizer = BertTokenizerFast(vocab_file=str(directory / "vocab.txt"))
    model = BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), **sizes))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_fsdp_trains_as_ddp_does_on_half_the_state_per_rank_and_only_rank_0_loads_the_model(tmp_path: Path) -> None:
    """From the same pretrained weights, fsdp's losses are ddp's (auto, on CPU) step by step, each fsdp rank holds
    about half of ddp's parameters + gradients + AdamW state, and final/ is a consolidated model that fills a mask.
    Rank 0 alone loads the weights; rank 1 builds the model on the meta device and receives only its shard of rank
    0's weights: its growth in resident memory while the model is set up is below the model's size, where a DDP rank
    loads all of it. (One pair of launches for both contracts: each launch costs about 10 s of start-up.)"""
    weights = pretrained_bert(tmp_path / "bert")
    options = {"model_name_or_path": str(tmp_path / "bert"), "max_steps": "5", "demo_samples": "200"}
    ddp, fsdp = trained(tmp_path / "ddp", "auto", **options), trained(tmp_path / "fsdp", "fsdp", **options)

    assert ddp["sharding"]["mode"] == "ddp" and fsdp["sharding"]["mode"] == "fsdp"
    # auto on CPU is ddp; each says why, with DDP's estimate for the built model
    assert ddp["sharding"]["choice"].startswith("ddp (auto: on CPU there is no device memory to fit); DDP needs")
    assert fsdp["sharding"]["choice"].startswith("fsdp (MLM_SHARDING); DDP needs about")
    assert sorted(fsdp["losses"]) == sorted(ddp["losses"]) == [1, 2, 3, 4, 5]
    for step, loss in ddp["losses"].items():
        assert fsdp["losses"][step] == pytest.approx(loss, rel=0.005), step
    whole = per_rank(ddp)
    assert whole[0] == whole[1] > 0
    for share in per_rank(fsdp):  # dim-0 padding makes the shards a little uneven
        assert share == pytest.approx(whole[0] / 2, rel=0.01)
    for rank in fsdp["sharding"]["state_bytes_per_rank"]:
        assert rank["parameters"] > 0 and rank["gradients"] > 0 and rank["optimizer"] > 0
    assert all(peak > whole[0] for peak in fsdp["sharding"]["training_peak_bytes_per_rank"])  # resident, measured
    # the estimate counts the parameters the ranks measured (4 bytes each, all of them on a ddp rank)
    assert ddp["sharding"]["ddp_estimate"]["parameters"] * 4 == ddp["sharding"]["state_bytes_per_rank"][0]["parameters"]
    ddp_setup, fsdp_setup = ddp["sharding"]["setup_bytes_per_rank"], fsdp["sharding"]["setup_bytes_per_rank"]
    assert all(grown >= weights for grown in ddp_setup)  # each DDP rank loads the whole model
    assert fsdp_setup[0] >= weights  # rank 0 loads it, and sends each rank its shard
    # Never the whole model (its shard is half of it, the broadcast one tensor at a time), and under half DDP's rank 1.
    assert fsdp_setup[1] < weights and fsdp_setup[1] < ddp_setup[1] / 2
    fills_a_mask(tmp_path / "fsdp" / "final")


def test_weights_rank_0_cannot_load_end_every_rank_with_its_words(tmp_path: Path) -> None:
    """The other ranks wait for rank 0's model under fsdp: when rank 0 cannot load it, they end with the same
    one-line error at once (exit 2, the options' code), not at the process group's timeout. A damaged weights
    file is bad input, named, as for a DDP run."""
    pretrained_bert(tmp_path / "bert", {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2})
    (tmp_path / "bert" / "model.safetensors").write_bytes(b"not safetensors")
    done = entrypoint(env=sharded_env(tmp_path / "out", "fsdp", model_name_or_path=str(tmp_path / "bert")))
    assert done.returncode == 2, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "cannot load the model" in line]
    assert said and all("MLM_MODEL_NAME_OR_PATH" in line for line in said), done.stderr[-3000:]
    assert not any((tmp_path / "out").iterdir())  # bad input: the output directory as it was


def test_fsdp_stopped_by_sigterm_resumes_bit_identically(
    tmp_path: Path, whole: Path, job_in_process: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = whole / "checkpoint-10"
    listed = json.loads((checkpoint / ".complete").read_text())["files"]
    for state in ("model_dcp", "optimizer_dcp"):  # each rank's shard, listed in the marker with its digest
        assert {f"{state}/__0_0.distcp", f"{state}/__1_0.distcp", f"{state}/.metadata.pt"} <= set(listed)
    # no rank's shard passed off as the whole state, and no rank gathered the whole model to save it
    assert not (checkpoint / "optimizer.pt").exists() and not (checkpoint / "model.safetensors").exists()
    assert {"config.json", "tokenizer.json", "trainer_state.json"} <= set(listed)
    # The rank's refusal, before any process group: the job's main() in this process (a launch of two ranks costs
    # about 30 CPU-seconds of start-up; every rank refusing alike is test_weights_rank_0_cannot_load_...'s point).
    capsys.readouterr()
    refused = job_in_process(sharded_env(tmp_path / "other", "fsdp", model_name_or_path=str(checkpoint)))
    said = capsys.readouterr().err
    assert refused == 2 and "not a model; resume it (MLM_RESUME=" in said, said[-3000:]

    output = tmp_path / "stopped"
    env = sharded_env(output, "fsdp", **SAVING)
    process = start(env=env)
    wait_for(output / "checkpoint-10" / ".complete", process)
    process.send_signal(signal.SIGTERM)  # as docker stop: the launcher forwards it to torchrun and the ranks
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 75, stderr[-3000:]
    assert json.loads((output / "run.json").read_text())["status"] == "preempted"
    resumed_run = entrypoint(env=env)
    assert resumed_run.returncode == 0, resumed_run.stderr[-3000:]
    assert "resuming from" in resumed_run.stderr

    uninterrupted = load_file(whole / "final" / "model.safetensors")
    resumed = load_file(output / "final" / "model.safetensors")
    assert uninterrupted.keys() == resumed.keys()
    assert all(bool((uninterrupted[name] == resumed[name]).all()) for name in uninterrupted)


def test_fsdp_of_two_ranks_resumes_on_one(whole: Path, on_one_rank: Path) -> None:
    went_on = finished(on_one_rank)
    assert went_on["resumed_from_ranks"] == 2 and len(went_on["sharding"]["state_bytes_per_rank"]) == 1
    continues(went_on["losses"], logged_losses(whole), list(range(11, STEPS + 1)))


def test_a_checkpoint_of_one_rank_resumes_on_two(tmp_path: Path, on_one_rank: Path) -> None:
    """The weights and the optimizer state of one rank go on on two, resharded, the global batch kept (ddp changes
    world size in tests/e2e/test_reliability.py, 2 -> 1; the batch rule both ways: tests/test_checkpoints.py).
    The one rank's run is on_one_rank, which went on at the two-rank runs' global batch (1 rank x 8 x 2
    accumulation steps): its checkpoint-15 resumed on two goes on as that run did."""
    sharding = "fsdp"
    went_on = trained(tmp_path / "two", sharding, resume=str(on_one_rank / "checkpoint-15"))
    assert went_on["resumed_from_ranks"] == 1 and went_on["sharding"]["mode"] == sharding
    continues(went_on["losses"], logged_losses(on_one_rank), list(range(16, STEPS + 1)))


# The types the issue names beyond DistilBERT: BERT's layers, DeBERTa-v2's shared relative embeddings (read by every
# layer from the root unit), ModernBERT's alternating attention, ESM's head tied to its embeddings. RoBERTa's layers
# are BERT's units here; its packed rows train in tests/e2e/test_model_matrix.py.
MATRIX = ["bert", "deberta-v2", "modernbert", "esm"]
# Documents kept apart in packed rows (each document's own 4D mask, positions restarting) and in padding-free rows.
LAYOUT = {"deberta-v2": "packed", "modernbert": "packed", "esm": "padding_free"}


@pytest.mark.parametrize("model_type", MATRIX)
def test_the_model_matrix_trains_sharded(tmp_path: Path, model_type: str) -> None:
    """Each type, from scratch with the masked-only head, on two fsdp ranks: its layers each a unit, finite losses,
    an evaluation, and a consolidated final/ that fills a mask. BERT's run is streamed with DataLoader workers, so
    a stream and its held-out evaluation are sharded too; the others keep documents apart (LAYOUT)."""
    streamed = {"padding": LAYOUT.get(model_type, "dynamic")}
    if model_type == "bert":  # distinct lines: the demo's repeat its held-out ones, which a stream leaves out
        write_shards(tmp_path / "corpus", shards=4, per_shard=100)
        streamed = {"streaming": "true", "dataloader_num_workers": "2", "dataset": str(tmp_path / "corpus")}
    run = trained(
        tmp_path / "out", "fsdp", model_name_or_path=f"scratch:{model_type}", config_overrides=OVERRIDES.get(model_type, SMALL),
        demo_samples="200", max_steps="4", max_eval_samples="16", eval_strategy="steps", eval_steps="4", **streamed,
    )  # fmt: skip
    assert run["status"] == "finished" and run["model"]["head"] == "masked-only"
    assert run["packing"]["padding"] == LAYOUT.get(model_type, "dynamic")
    assert sorted(run["losses"]) == [1, 2, 3, 4] and all(math.isfinite(loss) for loss in run["losses"].values())
    assert math.isfinite(json.loads((tmp_path / "out" / "all_results.json").read_text())["eval_loss"])
    for share in per_rank(run):
        assert 0 < share < sum(per_rank(run))  # each rank holds a part
    fills_a_mask(tmp_path / "out" / "final")
