"""MLM_SHARDING=fsdp against ddp on two gloo ranks through the real job (torchrun): the same seed gives the same
losses step by step, each rank measures about half of ddp's parameters + gradients + AdamW state, and final/ is a
consolidated model that loads and fills a mask; a run resumed from a sharded checkpoint ends with the uninterrupted
run's weights bit for bit on the same ranks, and goes on as it did, within 2 %, resumed on one rank from two and on
two from one (the optimizer's shards resharded by torch.distributed.checkpoint). About 40, 35, 15 and 40 s."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from tests.conftest import run_torchrun, tiny_env
from tests.e2e.runs import continues, logged_losses, records
from tests.e2e.test_model_matrix import fills_a_mask

pytestmark = pytest.mark.slow

STEPS = 20


SAVING = {"save_strategy": "steps", "save_steps": "10"}


def trained(output_dir: Path, sharding: str, ranks: int = 2, **options: str) -> dict[str, Any]:
    """A 20-step run (global batch 16: 8 per device); its run.json, with the logged losses by step under "losses"."""
    env = tiny_env(
        output_dir, sharding=sharding, per_device_train_batch_size="8", max_steps=str(STEPS), eval_strategy="no",
        logging_steps="1", log_format="json", **{"save_strategy": "no", **options},
    )  # fmt: skip
    env["HF_HOME"] = os.environ["HF_HOME"]  # as the tests' autouse fixture set it (module fixtures run before)
    done = run_torchrun(env, ranks)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads((output_dir / "run.json").read_text())
    run["losses"] = logged_losses(output_dir)
    banners = [r for r in records(output_dir / "logs" / "train.jsonl") if r.get("event") == "banner"]
    run["resumed_from_ranks"] = banners[-1].get("resumed_from_ranks")
    return run


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory, hf_home: Path) -> Path:
    """An uninterrupted fsdp run on two ranks, saving at steps 10 and 20: its output directory."""
    output = tmp_path_factory.mktemp("whole") / "out"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", str(hf_home))
        trained(output, "fsdp", **SAVING)
    return output


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


def test_fsdp_resumes_bit_identically_from_its_sharded_checkpoint(tmp_path: Path, whole: Path) -> None:
    checkpoint = whole / "checkpoint-10"
    listed = json.loads((checkpoint / ".complete").read_text())["files"]
    assert {"optimizer_dcp/__0_0.distcp", "optimizer_dcp/__1_0.distcp", "optimizer_dcp/.metadata.pt"} <= set(listed)
    assert not (checkpoint / "optimizer.pt").exists()  # no rank's shard passed off as the whole state

    trained(tmp_path / "resumed", "fsdp", resume=str(checkpoint), **SAVING)

    uninterrupted = load_file(whole / "final" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "final" / "model.safetensors")
    assert uninterrupted.keys() == resumed.keys()
    assert all(bool((uninterrupted[name] == resumed[name]).all()) for name in uninterrupted)


RESUMED_STEPS = list(range(11, STEPS + 1))


def test_fsdp_of_two_ranks_resumes_on_one(tmp_path: Path, whole: Path) -> None:
    went_on = trained(tmp_path / "one", "fsdp", ranks=1, resume=str(whole / "checkpoint-10"))
    assert went_on["resumed_from_ranks"] == 2 and len(went_on["sharding"]["state_bytes_per_rank"]) == 1
    continues(went_on["losses"], logged_losses(whole), RESUMED_STEPS)


def test_fsdp_of_one_rank_resumes_on_two(tmp_path: Path) -> None:
    alone = tmp_path / "alone"  # the global batch of the two-rank runs: 1 rank x 8 x 2 accumulation steps
    uninterrupted = trained(alone, "fsdp", ranks=1, gradient_accumulation_steps="2", **SAVING)["losses"]
    went_on = trained(tmp_path / "two", "fsdp", resume=str(alone / "checkpoint-10"))
    assert went_on["resumed_from_ranks"] == 1
    continues(went_on["losses"], uninterrupted, RESUMED_STEPS)
