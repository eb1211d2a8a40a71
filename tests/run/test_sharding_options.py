"""What MLM_SHARDING=fsdp refuses, each as one line naming the option, before any data is read; what auto chooses
from DDP's memory estimate."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoModelForMaskedLM, DistilBertConfig

from tests.helpers import demo_config
from train.common.errors import ConfigError
from train.model.memory import choose_sharding, ddp_estimate
from train.run.sharding import check_sharding, resumed_mode, written_in


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (
            {"load_best_model_at_end": "true", "eval_strategy": "steps", "save_strategy": "steps"},
            "load_best_model_at_end",
        ),
        ({"save_strategy": "no", "fsdp": "full_shard"}, "leave the Trainer's fsdp"),
        ({"save_strategy": "no", "fp16": "true"}, "fp16 is not supported under fsdp"),
    ],
)
def test_fsdp_refuses(options: dict[str, str], said: str) -> None:
    config = demo_config(sharding="fsdp", **options)
    with pytest.raises(ConfigError, match=said) as refused:
        check_sharding(config.launch, config.training, config.adapting)
    assert str(refused.value).startswith("MLM_SHARDING=fsdp: ") and "\n" not in str(refused.value)


def test_the_trainers_fsdp_under_ddp_is_refused_naming_the_option() -> None:
    config = demo_config(fsdp="full_shard auto_wrap", save_strategy="no")
    with pytest.raises(ConfigError, match="the Trainer's own FSDP is not used by this job; set MLM_SHARDING=fsdp"):
        check_sharding(config.launch, config.training, config.adapting)


def test_ddp_is_the_default_and_checks_nothing() -> None:
    config = demo_config()
    assert config.launch.sharding == "ddp"
    check_sharding(config.launch, config.training, config.adapting)


GIB = 2**30
ESTIMATE = {"parameters": 3_000_000_000, "state": 48 * GIB, "activations": 6 * GIB, "total": 54 * GIB}


@pytest.mark.parametrize(
    ("gpu_memory", "world_size", "mode", "said"),
    [
        (80 * GIB, 8, "ddp", "ddp (auto: within 85% of the smallest GPU's 80.0 GiB)"),
        (40 * GIB, 8, "fsdp", "fsdp (auto: more than 85% of the smallest GPU's 40.0 GiB)"),
        (40 * GIB, 1, "ddp", "ddp (auto: one rank, nothing to shard over)"),
        (None, 2, "ddp", "ddp (auto: on CPU there is no device memory to fit)"),
    ],
)
def test_auto_shards_what_ddp_cannot_fit(gpu_memory: int | None, world_size: int, mode: str, said: str) -> None:
    chosen, words = choose_sharding("auto", ESTIMATE, gpu_memory, world_size)
    assert chosen == mode and words.startswith(said)
    assert "DDP needs about 54.0 GiB a rank" in words and "3,000,000,000" in words
    assert choose_sharding("ddp", ESTIMATE, 40 * GIB, 8)[0] == "ddp"  # what is set is what runs
    kept = choose_sharding("auto", ESTIMATE, 40 * GIB, 8, written="ddp")  # a resume keeps its checkpoint's mode
    assert kept[0] == "ddp" and kept[1].startswith("ddp (auto: the mode the resumed checkpoint was written in)")
    small = {"parameters": 488_005, "state": 7_808_080, "activations": 2**20, "total": 7_808_080 + 2**20}
    assert "DDP needs about 8.4 MiB a rank (7.4 MiB of weights" in choose_sharding("auto", small, None, 2)[1]


def test_the_estimate_counts_the_built_models_state_and_activations() -> None:
    config = demo_config(save_strategy="no", per_device_train_batch_size="4", max_seq_length="32")
    model = AutoModelForMaskedLM.from_config(
        DistilBertConfig(vocab_size=100, dim=16, hidden_dim=32, n_layers=2, n_heads=2, max_position_embeddings=32)
    )
    estimate = ddp_estimate(model, config.training, config.data.max_seq_length)
    parameters = sum(p.numel() for p in model.parameters())
    assert estimate["parameters"] == parameters and estimate["state"] == 16 * parameters
    assert estimate["activations"] == 4 * 32 * 16 * 2 * 34 * 2  # tokens x hidden x layers x 34 values, fp32
    assert estimate["total"] == estimate["state"] + estimate["activations"]


def test_a_resume_trains_in_the_mode_its_checkpoint_was_written_in(tmp_path: Path) -> None:
    ddp, fsdp, bare = tmp_path / "checkpoint-10", tmp_path / "checkpoint-20", tmp_path / "checkpoint-30"
    (ddp).mkdir()
    (ddp / "optimizer.pt").write_bytes(b"")
    (fsdp / "optimizer_dcp").mkdir(parents=True)
    bare.mkdir()
    assert (written_in(ddp), written_in(fsdp), written_in(bare)) == ("ddp", "fsdp", None)
    assert resumed_mode(demo_config(sharding="auto").launch, fsdp) == "fsdp"
    assert resumed_mode(demo_config(sharding="fsdp").launch, bare) is None
    with pytest.raises(ConfigError, match="MLM_SHARDING=fsdp: checkpoint-10 was written under ddp; resume it with"):
        resumed_mode(demo_config(sharding="fsdp").launch, ddp)
    with pytest.raises(ConfigError, match="checkpoint-20 was written under fsdp; resume it with MLM_SHARDING=fsdp"):
        resumed_mode(demo_config().launch, fsdp)
