"""MLM_SHARDING=fsdp against ddp on two gloo ranks through the real job (torchrun): the same seed gives the same
losses step by step, each rank measures about half of ddp's parameters + gradients + AdamW state, and final/ is a
consolidated model that loads and fills a mask; a run resumed from a sharded checkpoint ends with the uninterrupted
run's weights bit for bit. About 40 s and 45 s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from tests.conftest import run_torchrun, tiny_env
from tests.e2e.test_model_matrix import fills_a_mask

pytestmark = pytest.mark.slow

STEPS = 20


def trained(output_dir: Path, sharding: str, **options: str) -> dict[str, Any]:
    """A 20-step run on 2 ranks; its run.json, with the logged losses by step under "losses"."""
    env = tiny_env(
        output_dir, sharding=sharding, per_device_train_batch_size="8", max_steps=str(STEPS), eval_strategy="no",
        logging_steps="1", log_format="json", **{"save_strategy": "no", **options},
    )  # fmt: skip
    done = run_torchrun(env, 2)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads((output_dir / "run.json").read_text())
    records = [json.loads(line) for line in (output_dir / "logs" / "train.jsonl").read_text().splitlines()]
    run["losses"] = {r["step"]: r["loss"] for r in records if "loss" in r}
    return run


def per_rank(run: dict[str, Any]) -> list[int]:
    return [sum(rank.values()) for rank in run["sharding"]["state_bytes_per_rank"]]


def test_fsdp_trains_as_ddp_does_on_half_the_state_per_rank(tmp_path: Path) -> None:
    ddp, fsdp = trained(tmp_path / "ddp", "ddp"), trained(tmp_path / "fsdp", "fsdp")

    assert ddp["sharding"]["mode"] == "ddp" and fsdp["sharding"]["mode"] == "fsdp"
    assert sorted(fsdp["losses"]) == sorted(ddp["losses"]) == list(range(1, STEPS + 1))
    for step, loss in ddp["losses"].items():
        assert fsdp["losses"][step] == pytest.approx(loss, rel=0.005), step
    whole = per_rank(ddp)
    assert whole[0] == whole[1] > 0
    for share in per_rank(fsdp):  # dim-0 padding makes the shards a little uneven
        assert share == pytest.approx(whole[0] / 2, rel=0.01)
    for rank in fsdp["sharding"]["state_bytes_per_rank"]:
        assert rank["parameters"] > 0 and rank["gradients"] > 0 and rank["optimizer"] > 0
    fills_a_mask(tmp_path / "fsdp" / "final")


def test_fsdp_resumes_bit_identically_from_its_sharded_checkpoint(tmp_path: Path) -> None:
    saving = {"save_strategy": "steps", "save_steps": "10"}
    trained(tmp_path / "whole", "fsdp", **saving)
    checkpoint = tmp_path / "whole" / "checkpoint-10"
    listed = json.loads((checkpoint / ".complete").read_text())["files"]
    assert {"optimizer_dcp/__0_0.distcp", "optimizer_dcp/__1_0.distcp", "optimizer_dcp/.metadata.pt"} <= set(listed)
    assert not (checkpoint / "optimizer.pt").exists()  # no rank's shard passed off as the whole state

    trained(tmp_path / "resumed", "fsdp", resume=str(checkpoint), **saving)

    whole = load_file(tmp_path / "whole" / "final" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "final" / "model.safetensors")
    assert whole.keys() == resumed.keys()
    assert all(bool((whole[name] == resumed[name]).all()) for name in whole)
